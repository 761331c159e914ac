"""``python -m tests.fuzz``: run the atheris targets one after the other (``tox -e fuzz``).

No kubelet counterpart. Each target gets ``--minutes`` of wall time
(libFuzzer's ``-max_total_time``), or with ``--cpu-minutes`` that much CPU
time (user + system of the target's processes, from ``wait4``): on a shared
machine a niced target gets a fraction of a core, so it is started again,
on the corpus it grew, until it has used its CPU time. A target that crashes
is started again for what is left of its time (up to ``--restarts`` times),
so one bug does not end the run. New inputs and crash files go to ``--work`` (the kept seeds
in ``tests/fuzz/corpus`` are only read). At the end a table gives, per
target, executions, coverage (libFuzzer's ``cov``: instrumented edges of
the package reached; ``ft``: features), the corpus size, CPU seconds and
the crash files; the exit code is 1 if anything crashed or hung. ``--keep``
merges the new inputs into the kept corpora (libFuzzer's ``-merge=1``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

TARGETS = ("fuzz_store", "fuzz_checkpoints", "fuzz_report", "fuzz_registration", "fuzz_patch")
_DONE = re.compile(rb"#(\d+)\s+DONE\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_STAT = re.compile(rb"#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+) corp: (\d+)/")


@dataclasses.dataclass
class Result:
    target: str
    execs: int = 0
    cov: int = 0
    ft: int = 0
    corpus: int = 0
    cpu: float = 0.0
    wall: float = 0.0
    crashes: list[str] = dataclasses.field(default_factory=list)


def _run_once(
    target: str, seconds: int, work: pathlib.Path, log: pathlib.Path
) -> tuple[bytes, float]:
    cmd = [
        sys.executable, "-m", f"tests.fuzz.{target}", "--work", str(work),
        f"-max_total_time={seconds}", f"-timeout={_TIMEOUT.seconds}", "-rss_limit_mb=2048",
        "-print_final_stats=1",
    ]  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env())
        _STOP.child = proc.pid
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            _STOP.child = None
        if status and not _STOP.asked:
            out.write(f"\nfuzz runner: {target} exited with status {status}\n".encode())
    return log.read_bytes(), usage.ru_utime + usage.ru_stime


class _Timeout:
    """libFuzzer's ``-timeout``: an input running longer is a hang. It is wall time, so a
    niced target on a loaded machine needs more (``--timeout``)."""

    seconds = 10


_TIMEOUT = _Timeout()


class _Stop:
    """SIGTERM to the runner: passed to the running target (libFuzzer stops as on SIGINT,
    with its figures; SIGINT itself may be ignored, as in a background job), and no
    further run; the table is printed as at the end."""

    asked = False
    child: int | None = None

    def __call__(self, signum: int, frame: object) -> None:
        self.asked = True
        if self.child is not None:
            os.kill(self.child, signal.SIGTERM)


_STOP = _Stop()


# A CPU-budget run shorter than this is not started: libFuzzer's start-up
# (loading the corpus) would be most of it.
_MIN_RUN_S = 5


def _left(result: Result, budget: int, cpu: bool, start: float) -> int:
    used = result.cpu if cpu else time.monotonic() - start
    left = budget - int(used)
    return 0 if cpu and left < _MIN_RUN_S else left


def run(
    target: str, minutes: float, work: pathlib.Path, restarts: int, *, cpu: bool = False
) -> Result:
    """Fuzz ``target`` for ``minutes`` of wall time, or of CPU time if ``cpu``."""
    result = Result(target)
    budget = int(minutes * 60)
    log = work / f"{target}.log"
    log.unlink(missing_ok=True)
    start = time.monotonic()
    crashes_left = restarts
    while not _STOP.asked and (left := _left(result, budget, cpu, start)) > 0:
        offset = log.stat().st_size if log.exists() else 0
        text, used = _run_once(target, left, work, log)
        result.cpu += used
        part = text[offset:]
        stats = _DONE.findall(part) or _STAT.findall(part)
        if stats:
            execs, cov, ft, corp = map(int, stats[-1])
            result.execs += execs
            result.cov, result.ft, result.corpus = max(result.cov, cov), max(result.ft, ft), corp
        # libFuzzer also writes the slowest input so far ("slow-unit-"): not a stop.
        written = [c.decode() for c in re.findall(rb"Test unit written to (\S+)", part)]
        crashed = [c for c in written if not pathlib.Path(c).name.startswith("slow-unit-")]
        if not crashed and b"fuzz runner: " in part:
            crashed = [f"(no input kept; see {log})"]
        result.crashes += crashed
        # A wall budget is spent when a run ends without a crash; a CPU budget
        # goes on with another run (wall time is at least CPU time, so each
        # run's -max_total_time of what is left never overshoots it).
        if crashed:
            crashes_left -= 1
            if crashes_left < 0:
                break
        elif not cpu or used < 1:
            break
    result.wall = time.monotonic() - start
    return result


def keep(target: str, work: pathlib.Path) -> int:
    """Merge ``target``'s new inputs in ``work`` into its kept corpus (libFuzzer's
    ``-merge=1``: an input is added only if it reaches a feature the kept ones do not; the
    kept ones, the bug inputs among them, all stay). Returns how many were added."""
    kept = _corpus_dir(target)
    before = set(os.listdir(kept))
    cmd = [sys.executable, "-m", f"tests.fuzz.{target}", "--work", str(work),
           "-merge=1", f"-timeout={_TIMEOUT.seconds}", "-rss_limit_mb=2048", str(kept)]  # fmt: skip
    log = work / f"{target}.merge.log"
    with log.open("wb") as out:
        subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=_env(), check=True)
    return len(set(os.listdir(kept)) - before)


def _corpus_dir(target: str) -> pathlib.Path:
    return pathlib.Path(__file__).parent / "corpus" / target.removeprefix("fuzz_")


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__)
    parser.add_argument(
        "targets", nargs="*", default=list(TARGETS), help=f"of {', '.join(TARGETS)}"
    )
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=1.0, help="wall time per target")
    budget.add_argument(
        "--cpu-minutes", type=float, help="CPU time per target (runs again until it is used)"
    )
    parser.add_argument(
        "--work", type=pathlib.Path, help="new inputs and crashes (default: a temp dir)"
    )
    parser.add_argument(
        "--restarts", type=int, default=20, help="restarts after a crash, per target"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="then merge each target's new inputs into tests/fuzz/corpus (with --minutes 0 and "
        "--work DIR of an earlier run: only that)",
    )
    parser.add_argument(
        "--timeout",
        type=int,
        default=10,
        help="wall seconds after which one input is a hang (libFuzzer's -timeout; default 10)",
    )
    ns = parser.parse_args()
    _TIMEOUT.seconds = ns.timeout
    work = ns.work or pathlib.Path(tempfile.mkdtemp(prefix="kubelet-dra-fuzz-"))
    work.mkdir(parents=True, exist_ok=True)
    results = []
    signal.signal(signal.SIGTERM, _STOP)
    for target in ns.targets:
        if _STOP.asked:
            break
        if ns.cpu_minutes is not None:
            result = run(target, ns.cpu_minutes, work, ns.restarts, cpu=True)
        else:
            result = run(target, ns.minutes, work, ns.restarts)
        results.append(result)
        print(
            f"{target}: {result.execs} execs, cov {result.cov}, ft {result.ft}, "
            f"corpus {result.corpus}, {result.cpu:.0f} CPU s in {result.wall:.0f} s, "
            f"{len(result.crashes)} crashes",
            flush=True,
        )
    if ns.keep:
        for target in ns.targets:
            print(f"{target}: {keep(target, work)} inputs added to the kept corpus", flush=True)
    print(f"\nwork dir: {work}")
    print("| target | executions | coverage (cov / ft) | corpus | CPU s | wall s | crashes |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(
            f"| {r.target} | {r.execs} | {r.cov} / {r.ft} | {r.corpus} "
            f"| {r.cpu:.0f} | {r.wall:.0f} | {len(r.crashes)} |"
        )
    for r in results:
        for crash in r.crashes:
            print(f"crash in {r.target}: {crash}")
    return 1 if any(r.crashes for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
