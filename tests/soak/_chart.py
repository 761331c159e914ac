"""The soak's timeline as a PNG: the sampled series, one panel each, with the faults marked.

Needs matplotlib (``tox -e soak`` installs it); the top panel has one lane per part with
a bar for each fault, and every panel shades the windows of the faults that stop the
sidecar's writes (sidecar, API server, fault proxy).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from . import _schedule as plan

PANELS = (
    ("rss_mb", "RSS (MiB)"),
    ("malloc_in_use_mb", "malloc in use (MiB)"),
    ("fds", "open fds"),
    ("tasks", "asyncio tasks"),
    ("threads", "threads"),
    ("state_kb", "state file (KiB)"),
    ("writes_per_min", "writes / min"),
    ("pending", "dirty pods"),
    ("wrong", "pods not yet as said"),
)
COLOURS = {
    "sidecar": "tab:red",
    "driver": "tab:orange",
    "apiserver": "tab:purple",
    "proxy": "tab:blue",
    "disk": "tab:brown",
    "kubelet": "tab:green",
}


def draw(
    samples: Sequence[dict[str, Any]], faults: Sequence[dict[str, Any]], path: Path, title: str
) -> None:
    rows = _derived(samples)
    fig, axes = plt.subplots(
        len(PANELS) + 1, 1, figsize=(14, 2.0 * (len(PANELS) + 1)), sharex=True,
        gridspec_kw={"height_ratios": [1.6] + [1] * len(PANELS)},
    )  # fmt: skip
    _lanes(axes[0], faults)
    for ax, (key, label) in zip(axes[1:], PANELS, strict=True):
        points = [(r["t"] / 60, r[key]) for r in rows if r.get(key) is not None]
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], lw=0.8, color="black")
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        for fault in faults:
            if fault["part"].split("-")[0] in ("sidecar", "apiserver", "proxy"):
                colour = COLOURS[fault["part"].split("-")[0]]
                ax.axvspan(fault["start"] / 60, fault["end"] / 60, color=colour, alpha=0.12, lw=0)
    axes[-1].set_xlabel("minutes")
    axes[0].set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _lanes(ax: Any, faults: Sequence[dict[str, Any]]) -> None:
    names = plan.part_names(kubelet=any(f["part"] == "kubelet" for f in faults))
    for fault in faults:
        lane = names.index(fault["part"])
        colour = COLOURS[fault["part"].split("-")[0]]
        width = max((fault["end"] - fault["start"]) / 60, 0.02)
        ax.broken_barh([(fault["start"] / 60, width)], (lane - 0.4, 0.8), color=colour)
    ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)


def _derived(samples: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(samples):
        extra: dict[str, Any] = {}
        if row.get("state_bytes") is not None:
            extra["state_kb"] = row["state_bytes"] / 1024
        # Accepted writes in the minute before this sample.
        j = i
        while j > 0 and samples[j - 1]["t"] > row["t"] - 60:
            j -= 1
        span = row["t"] - samples[j]["t"]
        if span >= 10:
            extra["writes_per_min"] = (row["writes"] - samples[j]["writes"]) * 60 / span
        out.append({**row, **extra})
    return out
