"""``python -m tests.powerloss [--commits N] [--devices N] [--levels NORMAL,FULL] [-v]``.

Records a run of the health store under the write-logging shim per
``synchronous`` level, replays it to every flush point under both models of
``harness.py`` and prints what a restart finds at each: commits lost (had
returned, not in the file), files moved aside, half-applied commits. Exits 1
when the store's own level (``store.SYNCHRONOUS``) lost a returned commit or
any level lost the file. ``tox -e powerloss`` runs it.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import tempfile

from kubelet_dra.state import store
from tests.powerloss import harness


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.powerloss", description=__doc__)
    parser.add_argument("--commits", type=int, default=1500)
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--levels", default="NORMAL,FULL")
    parser.add_argument("-v", action="store_true", help="one line per crash point that lost")
    ns = parser.parse_args(argv)
    failed = False
    print(
        "| synchronous | model | crash points | commits lost: max | points that lost "
        "| lost per point (commits: points) | moved aside | half-applied |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="powerloss-") as tmp:
        for level in ns.levels.split(","):
            for model in ("dropped", "written"):
                out = harness.run(pathlib.Path(tmp), level, ns.commits, ns.devices, model)
                losing = [o for o in out if o.lost > 0]
                spread = collections.Counter(o.lost for o in losing)
                spread_text = ", ".join(f"{k}: {v}" for k, v in sorted(spread.items())[:8])
                aside = sum(o.moved_aside for o in out)
                mixed = sum(o.mixed for o in out)
                print(
                    f"| {level} | {model} | {len(out)} | {max(o.lost for o in out)} "
                    f"| {len(losing)} | {spread_text or '-'} | {aside} | {mixed} |"
                )
                if ns.v:
                    for o in losing:
                        print(
                            f"    op {o.point.index}: {o.point.returned} returned, "
                            f"{o.recovered} recovered, "
                            f"{o.point.wal_bytes_unsynced} WAL bytes unsynced"
                        )
                failed |= aside > 0 or mixed > 0
                failed |= level == store.SYNCHRONOUS and bool(losing)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
