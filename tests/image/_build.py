"""``deploy/image/build.py`` imported as a module (it is a script, not in a package)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load_build() -> ModuleType:
    if (module := sys.modules.get("kubelet_dra_image_build")) is not None:
        return module
    spec = importlib.util.spec_from_file_location(
        "kubelet_dra_image_build", ROOT / "deploy/image/build.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
