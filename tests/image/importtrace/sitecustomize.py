"""An import tracer for choosing what ``deploy/image/prune.txt`` may remove (no kubelet file).

Put this directory on ``PYTHONPATH`` with ``KDRA_IMPORT_TRACE=DIR`` set, and every Python
process started so (pytest, and the sidecar and kubectl plugin processes the tests start)
writes ``DIR/<pid>.tsv``: each first import of a ``kubernetes`` module, with the file and
line outside kubernetes and importlib that caused it (the lazy ``__getattr__`` of
``kubernetes.client`` included, as it imports through importlib), and at exit
``DIR/<pid>.modules``: every module it had loaded. docs/deploy.md ("The image") has the
command and what it found.
"""

import atexit
import os
import sys
import types

_OUT = os.environ.get("KDRA_IMPORT_TRACE")


def _origin() -> str:
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        skip = name.startswith("<") or "/kubernetes/" in name or "/importlib/" in name
        if not (skip or name == __file__):
            return f"{name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _start(out: str) -> None:
    trace = open(os.path.join(out, f"{os.getpid()}.tsv"), "a", buffering=1)  # noqa: SIM115
    trace.write(f"#argv\t{sys.argv!r}\n")

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event == "import" and str(args[0]).startswith("kubernetes"):
            trace.write(f"{args[0]}\t{_origin()}\n")

    def dump() -> None:
        with open(os.path.join(out, f"{os.getpid()}.modules"), "w") as f:
            f.write(f"#argv\t{sys.argv!r}\n" + "\n".join(sorted(sys.modules)) + "\n")

    sys.addaudithook(hook)
    atexit.register(dump)


if _OUT:
    _start(_OUT)
