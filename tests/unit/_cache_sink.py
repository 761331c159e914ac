"""A health-cache sink that records every call, for the healthinfo unit tests."""

from __future__ import annotations

from collections.abc import Iterable

from kubelet_dra import models
from kubelet_dra.state import healthinfo


class Sink:
    """Every call the cache makes on its sink, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def stage(self, key: models.DeviceKey, record: models.DeviceHealth) -> None:
        self.calls.append(("stage", (key, record)))

    def stage_many(
        self, records: Iterable[tuple[healthinfo.StagedKey, models.DeviceHealth]]
    ) -> None:
        self.calls.append(("stage_many", [(tuple(k), r) for k, r in records]))

    def stage_delete(self, keys: Iterable[models.DeviceKey]) -> None:
        self.calls.append(("stage_delete", sorted(keys)))
