"""The taint bridge's memory across restarts: one small JSON file in the state dir.

The state file of ``loop``; no kubelet counterpart. It holds one :class:`policy.Track` per
device that is not plainly healthy, so a restart neither restarts ``--taint-after`` nor
forgets a taint that must stay. A file of its own, not a table in ``health.sqlite``: the
entries are few and change only on health transitions. It is written whole (temporary
file, fsync, rename), so a crash leaves the old or the new version; a file that cannot be
read is set aside (``.bad``) and the bridge starts from the rules it finds in the API.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from kubelet_dra import errors, models
from kubelet_dra.taints import policy

logger = logging.getLogger(__name__)

FILE_NAME = "taints.json"
_FORMAT = 1


class TaintStateFile:
    """Load and save the tracks of one node's devices."""

    def __init__(self, state_dir: pathlib.Path) -> None:
        self.path = pathlib.Path(state_dir) / FILE_NAME

    def load(self) -> dict[models.DeviceKey, policy.Track]:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            logger.error("taint state %s cannot be read (%s); starting empty", self.path, exc)
            return {}
        try:
            return _decode(json.loads(raw))
        except (ValueError, KeyError, TypeError) as exc:
            bad = self.path.with_suffix(".bad")
            with contextlib.suppress(OSError):
                self.path.replace(bad)
            logger.error(
                "taint state %s is not valid (%s); moved to %s, starting from the API's rules",
                self.path, exc, bad.name,
            )  # fmt: skip
            return {}

    def save(self, tracks: Mapping[models.DeviceKey, policy.Track]) -> None:
        """Replace the file atomically; raises ``errors.StoreError``."""
        data = json.dumps(_encode(tracks), separators=(",", ":"), sort_keys=True).encode()
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
        except OSError as exc:
            raise errors.StoreError(f"taint state {self.path} not written: {exc}") from exc


def _encode(tracks: Mapping[models.DeviceKey, policy.Track]) -> dict[str, Any]:
    devices = []
    for key, track in sorted(tracks.items()):
        entry: dict[str, Any] = {
            "device": list(key),
            "health": track.health.value,
            "since": track.since,
        }
        if track.taint is not None:
            entry["taint"] = {
                "value": track.taint.value,
                "timeAdded": track.taint.time_added,
                "message": track.taint.message,
            }
        devices.append(entry)
    return {"format": _FORMAT, "devices": devices}


def _decode(doc: Any) -> dict[models.DeviceKey, policy.Track]:
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise ValueError("unknown format")
    tracks: dict[models.DeviceKey, policy.Track] = {}
    for entry in doc["devices"]:
        driver, pool, device = (str(part) for part in entry["device"])
        taint = None
        if entry.get("taint") is not None:
            raw = entry["taint"]
            taint = policy.Taint(
                str(raw["value"]), float(raw["timeAdded"]), str(raw.get("message", ""))
            )
        tracks[models.DeviceKey(driver, pool, device)] = policy.Track(
            models.HealthStatus(entry["health"]), float(entry["since"]), taint
        )
    return tracks
