"""The soak's verdict and its outputs: summary.json, summary.md (the table), samples.csv, a PNG.

:func:`judge` turns a finished :class:`~tests.soak._run.Soak` into the summary: each
check with its figure, its bound and ``ok``. Resource slopes are fitted with
:func:`~tests.soak._checks.pooled_slope` on the samples after the first
:func:`settle` seconds and after each sidecar life's first :data:`LIFE_WARMUP`
seconds (its imports, caches and first lists).

Bounds (per hour, of the pooled slope): :data:`LONG` for runs of 25 minutes or more
(the issue's: RSS below 2 MB an hour; fds and tasks "0", read as at most 10 an hour:
the soak restarts a driver about 20 times an hour and the proxy breaks about 100 API
connections, so a leak of one per event is 20 to 100 an hour, while the counts
themselves move by a few as streams and connections come and go); :data:`SHORT`
for the CI's 3 minutes, where a life lasts a minute and only a gross leak can show.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from . import _checks as checks
from . import _schedule as plan

if TYPE_CHECKING:
    from ._run import Soak

LIFE_WARMUP = 120.0
SERIES = ("rss_mb", "malloc_in_use_mb", "fds", "tasks", "threads", "state_mb")
#: Fitted the same way and reported, with no bound of their own: the RSS's parts
#: (anonymous memory and pages of files), glibc's free heap and its own mmapped chunks,
#: and CPython's allocated blocks (in thousands), which say where an RSS slope comes
#: from: anonymous memory up with the blocks flat is CPython's arenas kept, not objects.
PARTS = {"rss_anon_mb": ("anonymous", "MB"), "rss_file_mb": ("files", "MB"),
         "malloc_free_mb": ("of which glibc's free heap", "MB"),
         "malloc_mmapped_mb": ("glibc's mmapped chunks", "MB"),
         "py_kblocks": ("CPython's allocated blocks", "thousand")}  # fmt: skip
#: The most the state file's WAL may hold. SQLite checkpoints it at 1,000 pages
#: (``wal_autocheckpoint``) and reuses the file rather than shrinking it, so its size
#: climbs to a plateau and stays: a slope through that climb is no leak (the hour's run
#: read +9.7 MB/h for the main file and its WAL together). Twice a checkpoint's worth of
#: 4 KiB pages with their 24-byte frame headers, for a checkpoint a reader held back.
WAL_CAP = 2 * 1000 * (4096 + 24) + 32


@dataclasses.dataclass(frozen=True)
class Bounds:
    """Largest allowed pooled slope of each series, per hour."""

    rss_mb: float
    #: glibc's bytes in use (``kubelet_dra_malloc_in_use_bytes``): what the RSS bound is
    #: about, without the free heap glibc keeps after a burst (docs/memory.md).
    malloc_in_use_mb: float
    fds: float
    tasks: float
    threads: float
    state_mb: float


LONG = Bounds(rss_mb=2.0, malloc_in_use_mb=2.0, fds=10.0, tasks=10.0, threads=10.0, state_mb=1.0)
SHORT = Bounds(
    rss_mb=60.0, malloc_in_use_mb=60.0, fds=120.0, tasks=120.0, threads=120.0, state_mb=30.0
)


def bounds_for(minutes: float) -> Bounds:
    return LONG if minutes >= 25 else SHORT


def settle(minutes: float) -> float:
    """Seconds at the start left out of the fits: 5 minutes, or a third of a short run."""
    return min(300.0, minutes * 60 / 3)


def slopes(soak: Soak) -> dict[str, float | None]:
    starts = soak.world.sidecar_starts
    skip = settle(soak.opts.minutes)
    series: dict[str, list[tuple[int, float, float]]] = {name: [] for name in (*SERIES, *PARTS)}
    for row in soak.samples:
        life = int(row["life"])
        born = starts[life - 1] - soak.t0 if 0 < life <= len(starts) else 0.0
        if row["t"] < skip or row["t"] < born + LIFE_WARMUP:
            continue
        values = dict(row)
        # The main file alone: the WAL is held to WAL_CAP instead (see there).
        if row.get("state_db_bytes") is not None:
            values["state_mb"] = row["state_db_bytes"] / 2**20
        for name, points in series.items():
            if values.get(name) is not None:
                points.append((life, float(row["t"]), float(values[name])))
    out = {}
    for name, points in series.items():
        slope = checks.pooled_slope(points)
        out[name] = None if slope is None else slope * 3600
    return out


def judge(soak: Soak, final: dict[str, Any]) -> dict[str, Any]:
    bounds = bounds_for(soak.opts.minutes)
    lost = [dataclasses.asdict(x) for x in soak.conv.lost]
    if final["converged_after"] is None:
        lost.append({"pod": "(final)", "wrong": final["wrong"]})
    blips = checks.blips(soak.world, soak.proxy.writes, soak.t0, condition=soak.beside_kubelet)
    refused = [dataclasses.asdict(r) for r in soak.proxy.refused]
    fitted = slopes(soak)
    resources = {
        name: _resource(fitted[name], getattr(bounds, name), upper_only=name in UPPER_ONLY)
        for name in SERIES
    }
    if fitted["malloc_in_use_mb"] is None:
        # No glibc 2.33 under the sidecar: no gauge to fit, which is no failure.
        resources["malloc_in_use_mb"]["ok"] = True
    resources["wal_bytes"] = _capped(soak.samples, "wal_bytes", WAL_CAP)
    lags = sorted(soak.conv.lags)
    phantom = _phantom_kubelet(soak.samples, beside=soak.beside_kubelet)
    rows = [r for r in soak.samples]
    minutes_run = (rows[-1]["t"] / 60) if rows else 0.0
    summary = {
        "seed": soak.opts.seed,
        "sidecar_env": dict(soak.opts.sidecar_env),
        "minutes_planned": soak.opts.minutes,
        "minutes_run": round(minutes_run, 2),
        "faults": _fault_counts(soak),
        "health_changes": len(soak.schedule.changes),
        "status_writes_accepted": len(soak.proxy.writes),
        "writes_per_minute": round(len(soak.proxy.writes) / max(minutes_run, 1e-9), 1),
        "proxy_requests": soak.proxy.requests,
        "proxy_injected": dict(soak.proxy.injected),
        "patch_tests_failed": soak.proxy.test_failures,
        "sidecar_lives": soak.sidecar.lives,
        "lost_final_states": lost,
        "convergence_bound_s": checks.BOUND,
        "convergence_lag_s": {
            "count": len(lags),
            "p50": _pct(lags, 0.5),
            "p99": _pct(lags, 0.99),
            "max": lags[-1] if lags else None,
        },
        "final_convergence": final,
        "unknown_blips": blips,
        "refused_invalid": refused,
        "resources": resources,
        "rss_parts_slope_per_hour": {
            name: None if (value := fitted[name]) is None else round(value, 3) for name in PARTS
        },
        "peaks": _peaks(soak.samples),
        "harness_errors": soak.errors + [f"proxy: {e}" for e in soak.proxy.errors],
        "phantom_kubelet": phantom[:5],
        "phantom_kubelet_samples": len(phantom),
        "kubelet": _kubelet_side(soak),
    }
    summary["ok"] = (
        not lost
        and not phantom
        and not blips
        and not refused
        and all(r["ok"] for r in resources.values())
        and not summary["harness_errors"]
    )
    _write(soak, summary)
    return summary


def _phantom_kubelet(
    samples: list[dict[str, Any]], *, beside: bool = False
) -> list[dict[str, Any]]:
    """Samples in which the sidecar saw a kubelet that is not there.

    Without a kubelet: any pod left to one, or a removal, is our own write taken for
    someone else's. ``beside`` a kubelet with its gate on: pods left to it are right,
    but a removal of the field is not (that kubelet never removes it).
    """
    return [
        {"t": r["t"], "kubelet_owned": r.get("kubelet_owned"), "removes": r.get("kubelet_removes")}
        for r in samples
        if r.get("kubelet_removes") or (r.get("kubelet_owned") and not beside)
    ]


def _kubelet_side(soak: Soak) -> dict[str, Any] | None:
    """Beside a real kubelet, its own field over the run, for comparison (not judged):
    pods it left behind for longer than the bound, its lags, its Unknown blips."""
    if soak.kconv is None:
        return None
    lags = sorted(soak.kconv.lags)
    owned = [r["kubelet_owned"] for r in soak.samples if r.get("kubelet_owned") is not None]
    return {
        "line": soak.opts.kubelet,
        "restarts": sum(1 for e in soak.events if e["kind"] == "kubelet-restart"),
        "field_lost": len(soak.kconv.lost),
        "field_lag_s": {"count": len(lags), "p50": _pct(lags, 0.5), "p99": _pct(lags, 0.99)},
        "field_unknown_samples": sum(r.get("kubelet_unknown") or 0 for r in soak.samples),
        "pods_left_to_it_at_end": owned[-1] if owned else None,
    }


def _capped(samples: list[dict[str, Any]], name: str, cap: int) -> dict[str, Any]:
    values = [r[name] for r in samples if r.get(name) is not None]
    peak = max(values) if values else None
    return {"max": peak, "cap": cap, "ok": peak is not None and peak <= cap}


#: Series whose bound is an upper one only. RSS falls when glibc gives freed heap back
#: (the sidecar's ``malloc_trim``, ``kubelet_dra/memtrim.py``): memory returned is no
#: leak, and the issue's bound is "below 2 MB an hour". The CI's 3 minutes failed on it
#: (-387 MB/h: a trim inside the last life's few fitted seconds) while the check was
#: two-sided. The counts (fds, tasks, threads) and the state file stay two-sided.
UPPER_ONLY = frozenset({"rss_mb", "malloc_in_use_mb"})


def _resource(slope: float | None, bound: float, *, upper_only: bool = False) -> dict[str, Any]:
    within = slope is not None and (slope <= bound if upper_only else abs(slope) <= bound)
    return {
        "slope_per_hour": None if slope is None else round(slope, 3),
        "bound_per_hour": bound,
        "upper_only": upper_only,
        "ok": within,
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


def _fault_counts(soak: Soak) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in soak.events:
        counts[event["kind"]] = counts.get(event["kind"], 0) + 1
    return dict(sorted(counts.items()))


def _peaks(samples: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    names = ("rss_mb", "rss_anon_mb", "rss_file_mb", "malloc_in_use_mb", "malloc_free_mb",
             "malloc_mmapped_mb", "py_kblocks", "fds", "patch_conns", "tasks", "threads",
             "state_bytes", "state_db_bytes", "wal_bytes")  # fmt: skip
    for name in (*names, "pending", "wrong"):
        values = [r[name] for r in samples if r.get(name) is not None]
        out[name] = {"min": min(values), "max": max(values)} if values else None
    return out


def table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (docs/reliability.md takes the longest run's)."""
    res = summary["resources"]
    lag = summary["convergence_lag_s"]
    peaks = summary["peaks"]

    def slope(name: str, unit: str) -> str:
        r = res[name]
        value = "n/a" if r["slope_per_hour"] is None else f"{r['slope_per_hour']:+.2f}"
        sign = "+" if r.get("upper_only") else "±"
        bound = f"bound {sign}{r['bound_per_hour']:g}"
        return f"{value} {unit}/h ({bound}) {'ok' if r['ok'] else 'FAIL'}"

    def span(name: str, fmt: str = "{:g}") -> str:
        p = peaks.get(name)
        return "n/a" if not p else f"{fmt.format(p['min'])} to {fmt.format(p['max'])}"

    faults = ", ".join(f"{k} {v}" for k, v in summary["faults"].items())
    lines = [
        "| | |",
        "|---|---|",
        f"| seed, length | {summary['seed']}, {summary['minutes_run']:.1f} min run "
        f"({summary['minutes_planned']:g} planned)"
        + "".join(f", {k}={v}" for k, v in (summary.get("sidecar_env") or {}).items())
        + " |",
        f"| faults ({sum(summary['faults'].values())}) | {faults} |",
        "| proxy answers injected | "
        + ", ".join(f"{k} {v}" for k, v in summary["proxy_injected"].items())
        + f" of {summary['proxy_requests']} requests |",
        f"| health changes, sidecar lives | {summary['health_changes']}, "
        f"{summary['sidecar_lives']} |",
        f"| status writes accepted | {summary['status_writes_accepted']} "
        f"({summary['writes_per_minute']:g} a minute) |",
        f"| lost final states | {len(summary['lost_final_states'])} "
        f"(bound {summary['convergence_bound_s']:g} s) |",
        f"| convergence lag after a change or fault | p50 {lag['p50']} s, p99 {lag['p99']} s, "
        f"max {lag['max'] and round(lag['max'], 1)} s ({lag['count']} episodes) |",
        f"| final convergence | {summary['final_convergence']['converged_after']} s "
        "after the run's end |",
        f"| Unknown blips (lease running) | {len(summary['unknown_blips'])} |",
        *_kubelet_rows(summary),
        f"| writes refused as invalid | {len(summary['refused_invalid'])} "
        f"(and {summary['patch_tests_failed']} JSON patches whose `test` failed: conflicts) |",
        f"| RSS slope | {slope('rss_mb', 'MB')} (range {span('rss_mb', '{:.1f}')} MB) |",
        f"| RSS slope by part (not judged) | {_parts_row(summary)} |",
        f"| malloc in use slope | {slope('malloc_in_use_mb', 'MB')} "
        f"(range {span('malloc_in_use_mb', '{:.1f}')} MB; free heap "
        f"{span('malloc_free_mb', '{:.1f}')} MB) |",
        f"| fds slope | {slope('fds', 'fds')} (range {span('fds')}) |",
        f"| asyncio tasks slope | {slope('tasks', 'tasks')} (range {span('tasks')}) |",
        f"| threads slope | {slope('threads', 'threads')} (range {span('threads')}) |",
        f"| state file slope (main file) | {slope('state_mb', 'MB')} "
        f"(range {span('state_db_bytes')} bytes; with its WAL {span('state_bytes')}) |",
        f"| state file WAL | max {res['wal_bytes']['max']} bytes (cap {res['wal_bytes']['cap']}) "
        f"{'ok' if res['wal_bytes']['ok'] else 'FAIL'} |",
        f"| dirty pods (pending writes) | range {span('pending')} |",
        f"| verdict | {'PASS' if summary['ok'] else 'FAIL'} |",
    ]
    return "\n".join(lines) + "\n"


def _parts_row(summary: dict[str, Any]) -> str:
    fitted = summary.get("rss_parts_slope_per_hour") or {}
    return "; ".join(
        f"{label} {'n/a' if fitted.get(name) is None else format(fitted[name], '+.2f')} {unit}/h"
        for name, (label, unit) in PARTS.items()
    )


def _kubelet_rows(summary: dict[str, Any]) -> list[str]:
    side = summary.get("kubelet")
    if not side:
        return [
            "| pods left to a kubelet that is not there | "
            f"{summary.get('phantom_kubelet_samples', 'n/a')} samples |"
        ]
    lag = side["field_lag_s"]
    return [
        f"| real kubelet | {side['line']}, {side['restarts']} restarts (SIGKILL), "
        f"{side['pods_left_to_it_at_end']} pods' field left to it at the end |",
        "| samples in which it removed the field (its gate is on: none expected) | "
        f"{summary.get('phantom_kubelet_samples', 'n/a')} |",
        f"| the kubelet's own field (not judged) | {side['field_lost']} pods behind for "
        f"longer than the bound; lag p50 {lag['p50']} s, p99 {lag['p99']} s; "
        f"{side['field_unknown_samples']} pod-samples Unknown while the lease ran |",
    ]


def _write(soak: Soak, summary: dict[str, Any]) -> None:
    out = soak.opts.out
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "summary.md").write_text(table(summary))
    keys = [
        "t",
        "life",
        "rss_mb",
        "rss_anon_mb",
        "rss_file_mb",
        "malloc_in_use_mb",
        "malloc_free_mb",
        "malloc_mmapped_mb",
        "py_kblocks",
        "fds",
        "api_conns",
        "patch_conns",
        "patch_idle",
        "threads",
        "tasks",
        "state_bytes",
        "state_db_bytes",
        "wal_bytes",
        "pending",
        "writes",
        "wrong",
        "kubelet_wrong",
        "kubelet_unknown",
    ]
    with (out / "samples.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(soak.samples)
    intervals = [
        {
            "part": i.part,
            "kind": i.kind,
            "start": i.start - soak.t0,
            "end": (i.end or i.start) - soak.t0,
        }
        for i in soak.world.intervals
        if i.start >= soak.t0
    ]
    (out / "faults.json").write_text(json.dumps(intervals, indent=1))
    if soak.opts.chart:
        try:
            from . import _chart
        except ImportError as exc:  # matplotlib is in tox -e soak, not in every env
            print(f"soak: no chart ({exc})")
            return
        _chart.draw(soak.samples, intervals, out / "soak.png", title=_title(summary))


def _title(summary: dict[str, Any]) -> str:
    verdict = "PASS" if summary["ok"] else "FAIL"
    return (
        f"kubelet-dra soak: seed {summary['seed']}, {summary['minutes_run']:.1f} min, "
        f"{sum(summary['faults'].values())} faults, {plan.PODS} pods: {verdict}"
    )
