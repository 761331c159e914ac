"""The kubelet's DRA checkpoint ``<root dir>/dra_manager_state``, read only.

Mirrors ``pkg/kubelet/cm/dra/state/checkpoint.go`` and ``state.go`` (the claim info cache the
kubelet's DRA manager persists after every ``NodePrepareResources`` and
``NodeUnprepareResources``): the CDI device IDs each driver returned at prepare, by which the
kubelet names a device in ``allocatedResourcesStatus``. ``cache show`` and harnesses without
a PodResources socket read it; ``run`` does not. :func:`parse` is pure (its docstring has
the file's format on every line); :func:`read` adds the file; :class:`CheckpointWatcher`
polls it on the injected clock and never raises out of its loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import pathlib
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors
from kubelet_dra.status import claims

logger = logging.getLogger(__name__)

FILE_NAME = "dra_manager_state"
"""``draManagerStateFileName`` in ``pkg/kubelet/cm/dra/manager.go``."""
KIND = "DRACheckpoint"
API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"

REASON_READ = "read"
REASON_JSON = "json"
REASON_CHECKSUM = "checksum"
REASON_KIND = "kind"
REASON_SHAPE = "shape"
REASONS = (REASON_READ, REASON_JSON, REASON_CHECKSUM, REASON_KIND, REASON_SHAPE)
"""Why a file is refused (the ``reason`` label of ``kubelet_dra_checkpoint_refused_total``)."""

MAX_BYTES = 64 * 1024 * 1024
"""A larger file is refused unread: a node's claims take kilobytes, not this."""


CheckpointError = errors.CheckpointError
"""A checkpoint file that cannot be used; ``reason`` is one of :data:`REASONS`."""


@dataclasses.dataclass(frozen=True, slots=True)
class PreparedClaim:
    """One ``ClaimInfoState``: a claim the kubelet prepared, with its drivers' answers."""

    namespace: str
    name: str
    uid: str
    pod_uids: frozenset[str]
    devices: tuple[claims.PreparedDevice, ...]

    @property
    def key(self) -> claims.ClaimKey:
        return claims.ClaimKey(self.namespace, self.name)


# -- parsing (pure) ----------------------------------------------------------------


def parse(blob: bytes) -> tuple[PreparedClaim, ...]:
    """The claims of a checkpoint file's bytes; :class:`CheckpointError` if unusable.

    The file, as every line writes it::

        {"Data": "<CheckpointData as JSON text>", "Checksum": <crc32 IEEE of Data's bytes>}

        CheckpointData = {"kind": "DRACheckpoint",
                          "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
                          "ClaimInfoStateList": [ClaimInfoState, ...] | null}
        ClaimInfoState = {"ClaimUID", "ClaimName", "Namespace",
                          "PodUIDs": {"<uid>": {}, ...} | null,      (a sets.Set[string])
                          "DriverState": {"<driver>": DriverState} | null}
        DriverState    = {"Devices": [Device, ...] | null, "skipNodeOperations"?: [...]}
        Device         = {"PoolName", "DeviceName", "ShareID"?: "<uid>" | null,
                          "RequestNames": [...] | null, "CDIDeviceIDs": [...] | null}

    What each line's ``state.go`` and ``checkpoint.go`` say (read from the
    sources of v1.34.4, v1.35.4, v1.36.3, v1.37.2 and v1.38.0-beta.0):

    ========== ============================================================= =======================
    line       claim state (``state.go``)                                    ``checkpoint.go``
    ========== ============================================================= =======================
    1.34       ``Device`` has no ``ShareID``; ``DriverState`` is ``Devices``   the envelope above
    1.35       ``Device.ShareID`` (``*types.UID``: a string or ``null``)       same
    1.36       as 1.35 (only the health state gained ``Message``)              same
    1.37       ``DriverState.skipNodeOperations`` (``omitempty``)              same
    1.38.0-b0  as 1.37                                                       same
    ========== ============================================================= =======================

    So one reader serves every line: ``ShareID`` and ``skipNodeOperations`` are
    optional, every list and map may be ``null`` (Go's nil), and a field we do
    not know is ignored, as Go's decoder ignores it. Two places where we are
    stricter than the kubelet, on purpose: the kubelet does not look at ``kind``
    and ``apiVersion`` (``GetClaimInfoStateList`` decodes the list only), and
    Go's decoder matches field names without regard to case; we refuse a file of
    another kind or version, and read the names exactly as the kubelet writes
    them. A file we refuse is never one the kubelet wrote for this purpose.

    Reading is all we do: the file is opened read-only, never locked, never
    written or moved (the kubelet replaces it by writing a temporary file and
    renaming it over, ``pkg/kubelet/util/store``, so a reader sees a whole old or
    a whole new file; a torn one only if something else wrote it).
    """
    envelope = _json(blob, "the file")
    if not isinstance(envelope, dict):
        raise CheckpointError(REASON_SHAPE, "the file is not a JSON object")
    data, checksum = envelope.get("Data"), envelope.get("Checksum")
    if not isinstance(data, str) or not _is_uint32(checksum):
        raise CheckpointError(REASON_SHAPE, "no string Data and uint32 Checksum")
    # Go checks crc32 of the Data string's bytes as it holds them (checkpoint.go
    # VerifyChecksum); "surrogatepass" keeps a lone surrogate from raising here.
    actual = zlib.crc32(data.encode("utf-8", "surrogatepass"))
    if actual != checksum:
        raise CheckpointError(
            REASON_CHECKSUM, f"Checksum {checksum} but the data's crc32 is {actual}"
        )
    content = _json(data.encode("utf-8", "surrogatepass"), "Data")
    if not isinstance(content, dict):
        raise CheckpointError(REASON_SHAPE, "Data is not a JSON object")
    kind, version = content.get("kind"), content.get("apiVersion")
    if kind != KIND or version != API_VERSION:
        raise CheckpointError(
            REASON_KIND, f"kind {kind!r}, apiVersion {version!r}: not {KIND} {API_VERSION}"
        )
    entries = _list(content.get("ClaimInfoStateList"), "ClaimInfoStateList")
    return tuple(_claim(entry, i) for i, entry in enumerate(entries))


def read(path: pathlib.Path) -> tuple[PreparedClaim, ...] | None:
    """The claims in the file at ``path``; ``None`` when there is no file."""
    try:
        with path.open("rb") as f:  # read-only, no lock: the kubelet renames over it
            blob = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(REASON_READ, f"{path}: {exc.strerror or exc}") from exc
    if len(blob) > MAX_BYTES:
        raise CheckpointError(REASON_READ, f"{path}: larger than {MAX_BYTES} bytes")
    return parse(blob)


def _json(blob: bytes, what: str) -> Any:
    try:
        return json.loads(blob)
    except (ValueError, RecursionError) as exc:
        # A torn or partial write ends here: "Expecting ',' delimiter: line 1 column 812".
        raise CheckpointError(REASON_JSON, f"{what} is not JSON ({exc})") from exc


def _is_uint32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def _list(value: object, where: str) -> list[Any]:
    if value is None:
        return []  # Go's nil slice
    if not isinstance(value, list):
        raise CheckpointError(REASON_SHAPE, f"{where} is not a list")
    return value


def _map(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}  # Go's nil map
    if not isinstance(value, dict):
        raise CheckpointError(REASON_SHAPE, f"{where} is not an object")
    return value


def _text(obj: Mapping[str, Any], field: str, where: str) -> str:
    value = obj.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise CheckpointError(REASON_SHAPE, f"{where}.{field} is not a string")
    return value


def _texts(value: object, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    if not all(isinstance(v, str) for v in items):
        raise CheckpointError(REASON_SHAPE, f"{where} holds a non-string")
    return tuple(items)


def _claim(entry: object, i: int) -> PreparedClaim:
    where = f"ClaimInfoStateList[{i}]"
    obj = _map(entry, where)
    devices: list[claims.PreparedDevice] = []
    # Go ranges over a map in random order; sorted drivers make ours stable.
    drivers = _map(obj.get("DriverState"), f"{where}.DriverState")
    for driver in sorted(drivers):
        state = _map(drivers[driver], f"{where}.DriverState[{driver}]")
        for j, device in enumerate(_list(state.get("Devices"), f"{where}.{driver}.Devices")):
            devices.append(_device(driver, device, f"{where}.{driver}.Devices[{j}]"))
    return PreparedClaim(
        namespace=_text(obj, "Namespace", where),
        name=_text(obj, "ClaimName", where),
        uid=_text(obj, "ClaimUID", where),
        pod_uids=frozenset(_map(obj.get("PodUIDs"), f"{where}.PodUIDs")),
        devices=claims.own_resource_ids(devices),
    )


def _device(driver: str, entry: object, where: str) -> claims.PreparedDevice:
    obj = _map(entry, where)
    share = obj.get("ShareID")  # absent before 1.35, null when not shared
    if share is not None and not isinstance(share, str):
        raise CheckpointError(REASON_SHAPE, f"{where}.ShareID is not a string")
    return claims.PreparedDevice(
        driver=driver,
        pool=_text(obj, "PoolName", where),
        device=_text(obj, "DeviceName", where),
        request_names=_texts(obj.get("RequestNames"), f"{where}.RequestNames"),
        cdi_ids=_texts(obj.get("CDIDeviceIDs"), f"{where}.CDIDeviceIDs"),
        share_id=share or None,
    )


# -- watching ----------------------------------------------------------------------

Apply = Callable[[tuple[PreparedClaim, ...]], None]


@dataclasses.dataclass(frozen=True, slots=True)
class _Identity:
    """What tells a new file from the one read before (the kubelet renames a new one in)."""

    inode: int
    size: int
    mtime_ns: int


class CheckpointWatcher:
    """Polls the checkpoint and hands every new set of claims to ``apply``.

    A missing file applies no claims (the API's view is used); a refused file
    is counted by reason (:attr:`refused`), logged once per file, and changes
    nothing: the claims of the last good file stay, as a torn read says
    nothing about the claims. :meth:`run` never raises but for cancellation.
    """

    def __init__(
        self,
        root_dir: pathlib.Path,
        *,
        apply: Apply,
        clock: clock_mod.Clock,
        interval: float = 2.0,
    ) -> None:
        self.path = root_dir / FILE_NAME
        self.interval = interval
        self.refused: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.reads = 0  # files read and applied (tests wait on it)
        self.last_error = ""
        self._apply, self._clock = apply, clock
        self._seen: _Identity | bool | None = False  # False: never looked
        # A look on its way in run(): check() records the file's identity in its thread
        # before the loop applies what it read, so the identity alone would say "caught
        # up" with the claims not yet in the index (a sync point read a pod without its
        # entries that way, at load).
        self._looking = False

    @property
    def present(self) -> bool:
        """Whether the file was there at the last look: a kubelet runs on this node."""
        return self._seen not in (False, None)

    @property
    def caught_up(self) -> bool:
        """Whether the file is as it was at the last look, and what that look read is
        applied: nothing new to read or to hand on yet."""
        return not self._looking and self._identity() == self._seen

    async def run(self) -> None:
        """Poll until cancelled: the file is looked at in a thread, applied on the loop."""
        while True:
            self._looking = True
            try:
                found = await asyncio.to_thread(self.check)
                if found is not None:
                    self.apply(found)
            finally:
                self._looking = False
            await self._clock.sleep(self.interval)

    def poll(self) -> bool:
        """Look once and apply what changed (tests, callers on one thread)."""
        found = self.check()
        if found is not None:
            self.apply(found)
        return found is not None

    def check(self) -> tuple[PreparedClaim, ...] | None:
        """The claims to apply if the file changed since the last look, else ``None``.

        A missing file is ``()``; a refused one is counted and logged, and is
        ``None``: the claims applied before stay.
        """
        identity = self._identity()
        if identity == self._seen:
            return None
        self._seen = identity
        if identity is None:
            return ()
        try:
            return read(self.path) or ()
        except CheckpointError as exc:
            self._refuse(exc)
        except Exception as exc:  # a bug must not stop the watch or the sidecar
            logger.exception("kubelet checkpoint %s: unexpected error", self.path)
            self._refuse(CheckpointError(REASON_READ, repr(exc)))
        return None

    def apply(self, found: Iterable[PreparedClaim]) -> None:
        """Hand ``found`` to the callback (on the caller's thread: the event loop)."""
        prepared = tuple(found)
        if self.last_error:
            logger.warning("kubelet checkpoint %s is usable again", self.path)
            self.last_error = ""
        logger.debug("kubelet checkpoint %s: %d claims", self.path, len(prepared))
        self._apply(prepared)
        self.reads += 1

    def _identity(self) -> _Identity | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            # Unreadable metadata: read() says why, once, until it changes.
            logger.debug("kubelet checkpoint %s: stat failed: %s", self.path, exc)
            return _Identity(-1, -1, -1)
        return _Identity(st.st_ino, st.st_size, st.st_mtime_ns)

    def _refuse(self, exc: CheckpointError) -> None:
        self.refused[exc.reason] = self.refused.get(exc.reason, 0) + 1
        if str(exc) != self.last_error:
            logger.error(
                "kubelet checkpoint %s refused (%s); keeping the CDI device IDs read before",
                self.path,
                exc,
            )
        self.last_error = str(exc)
