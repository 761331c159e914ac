"""Compile the bytecode of every module the sidecar and its tools import, run in the image.

deploy/image/build.py runs it with the image's /usr/bin/python3 (in a chroot), and
deploy/Containerfile runs it the same way, so both images carry the same ``.pyc`` files. It
mirrors no kubelet file.

The image's root filesystem is read-only at run time: without these files each start would
compile kubernetes' client (30 MB of source) again. Only what is imported is compiled (the
rest of the standard library and of site-packages stays source only; it compiles in memory
if ever imported). ``unchecked-hash``: the sources never change in the image, so Python
need not stat or hash them. Deterministic bytes: the caller sets ``PYTHONHASHSEED=0`` (set
and frozenset constants are marshalled in hash order) and ``PYTHONDONTWRITEBYTECODE=1`` (the
imports below must not write timestamp-based files of their own); files are compiled in
sorted order in one process.
"""

import importlib
import os
import pkgutil
import py_compile
import sys

if os.environ.get("PYTHONHASHSEED") != "0" or not sys.dont_write_bytecode:
    sys.exit("precompile.py: run with PYTHONHASHSEED=0 and PYTHONDONTWRITEBYTECODE=1")

import kubelet_dra

# The test kit's pytest plugin needs the `pytest` extra, which the image does not install.
EXTRA_ONLY = {"kubelet_dra.testing.pytest_plugin"}

for module in pkgutil.walk_packages(kubelet_dra.__path__, "kubelet_dra."):
    if not module.name.endswith(".__main__") and module.name not in EXTRA_ONLY:
        importlib.import_module(module.name)
files = sorted(
    {
        path
        for mod in list(sys.modules.values())
        if (path := getattr(mod, "__file__", None)) and path.endswith(".py")
    }
)
for path in files:
    py_compile.compile(
        path, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH
    )
print(f"precompile.py: {len(files)} modules")
