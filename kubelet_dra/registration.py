"""Plugin discovery: the registry watcher, GetInfo and version negotiation.

Counterpart of the kubelet's ``pkg/kubelet/pluginmanager`` (plugin watcher,
reconciler, operation generator) and of the registration handler's validation
in ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``.

:class:`RegistryWatcher` polls a plugins-registry directory (recursively) for
unix sockets instead of using inotify: a scan every
``settings.registry_poll_interval`` costs one ``scandir`` per directory and
needs no extra dependency, and the kubelet's own reconciler only acts once a
second anyway. A socket is identified by its path plus (inode, ctime), so a
socket re-created at the same path deregisters and registers again, as in the
kubelet.

Events are delivered to an async callback, ``on_event(PluginEvent)``, one at a
time and in order (a deregistration always precedes the re-registration of the
same path). ``plugins.PluginManager.handle`` is that callback.

Roles: an **observer** (the sidecar) only calls ``GetInfo`` and never
``NotifyRegistrationStatus``, so it cannot disturb the real kubelet's
registration; an **owner** acts as the kubelet and notifies the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import pathlib
import random
import stat
from collections.abc import Awaitable, Callable, Iterable, Sequence

import grpc

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors
from kubelet_dra import settings as settings_mod
from kubelet_dra._proto.pluginregistration.v1 import api_pb2 as reg_pb2
from kubelet_dra._proto.pluginregistration.v1 import api_pb2_grpc as reg_grpc

logger = logging.getLogger(__name__)

DRA_PLUGIN_TYPE = "DRAPlugin"
DRA_SERVICES = ("v1.DRAPlugin", "v1beta1.DRAPlugin")
"""``servicesSupportedByKubelet`` in ``dra_plugin.go``."""
HEALTH_SERVICES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
"""``healthServicesSupportedByKubelet``, in the kubelet's order of preference."""
NOTIFY_TIMEOUT = 5.0
"""The kubelet's timeout for ``NotifyRegistrationStatus``."""
_MAX_DEPTH = 8  # the registry is shallow; a bound keeps a pathological tree cheap


@dataclasses.dataclass(frozen=True, slots=True)
class PluginInfo:
    """A validated DRA plugin registration.

    ``socket`` is the registration socket ("" for a statically configured
    driver); ``endpoint`` is the DRA service socket the streams dial.
    """

    driver: str
    endpoint: str
    socket: str
    supported_versions: tuple[str, ...]
    dra_service: str
    health_service: str | None


class EventKind(enum.StrEnum):
    REGISTER = "register"
    DEREGISTER = "deregister"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginEvent:
    kind: EventKind
    plugin: PluginInfo


EventCallback = Callable[[PluginEvent], Awaitable[None]]


def pick_health_service(versions: Iterable[str] | None) -> str | None:
    """The health service to stream from: v1 over v1alpha1, ``None`` if neither."""
    offered = set(versions or ())
    return next((s for s in HEALTH_SERVICES if s in offered), None)


def validate_supported_services(versions: Sequence[str]) -> str:
    """The DRA service the kubelet would use: the plugin's first supported entry.

    Mirrors ``validateSupportedServices``: the plugin's order decides, health
    strings never make validation fail.
    """
    if not versions:
        raise errors.RegistrationError(
            "empty list of supported gRPC services (aka supported versions)"
        )
    for service in versions:
        if service in DRA_SERVICES:
            return service
    raise errors.RegistrationError(
        f"none of the supported gRPC services {list(versions)} is one of {list(DRA_SERVICES)}"
    )


def make_plugin_info(
    driver: str, endpoint: str, versions: Sequence[str], *, socket: str = ""
) -> PluginInfo:
    """Validate a registration (from GetInfo or static configuration)."""
    if not driver:
        raise errors.RegistrationError("empty driver name")
    dra_service = validate_supported_services(versions)
    return PluginInfo(
        driver=driver,
        endpoint=endpoint or socket,
        socket=socket,
        supported_versions=tuple(versions),
        dra_service=dra_service,
        health_service=pick_health_service(versions),
    )


def plugin_info_from_proto(info: reg_pb2.PluginInfo, socket: str) -> PluginInfo:
    """Validate a ``GetInfo`` answer; an empty endpoint means the socket itself."""
    if info.type != DRA_PLUGIN_TYPE:
        raise errors.RegistrationError(f"plugin type {info.type!r} is not {DRA_PLUGIN_TYPE!r}")
    return make_plugin_info(info.name, info.endpoint, list(info.supported_versions), socket=socket)


class _Retryable(errors.RegistrationError):
    """A failure a later attempt can cure (no server yet, timeout, transient error).

    ``kind`` (the gRPC code) keys the log-once set, since details vary per attempt.
    """

    def __init__(self, message: str, *, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


async def fetch_plugin_info(socket: str, *, role: settings_mod.Role, timeout: float) -> PluginInfo:
    """Register one socket: GetInfo, validate, and (as owner) notify the plugin."""
    async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        try:
            answer = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            raise _Retryable(f"GetInfo failed: {code}: {exc.details()}", kind=code) from exc
        try:
            info = plugin_info_from_proto(answer, socket)
        except errors.RegistrationError as exc:
            if role is settings_mod.Role.OWNER:
                await _notify(stub, registered=False, error=str(exc))
            raise
        if role is settings_mod.Role.OWNER:
            await _notify(stub, registered=True, error="")
        return info


async def _notify(stub: reg_grpc.RegistrationStub, *, registered: bool, error: str) -> None:
    status = reg_pb2.RegistrationStatus(plugin_registered=registered, error=error)
    try:
        await stub.NotifyRegistrationStatus(status, timeout=NOTIFY_TIMEOUT)
    except grpc.aio.AioRpcError as exc:
        # The kubelet keeps a plugin registered even when this call fails.
        logger.warning("NotifyRegistrationStatus failed: %s", exc.code().name)


@dataclasses.dataclass
class _Socket:
    """What the watcher knows about one socket path."""

    identity: tuple[int, int]  # (inode, ctime_ns)
    info: PluginInfo | None = None
    attempts: int = 0
    next_try: float = 0.0
    parked: bool = False  # a permanent failure: wait for the socket to change
    task: asyncio.Task[PluginInfo] | None = None


class RegistryWatcher:
    """Watches a plugins-registry directory and emits register/deregister events.

    ``static`` plugins (built with :func:`make_plugin_info`) are registered at
    start for environments without a registry; ``directory=None`` disables the
    scan. Use as ``async with`` or call :meth:`start` / :meth:`close`.
    """

    def __init__(
        self,
        directory: pathlib.Path | str | None,
        *,
        role: settings_mod.Role,
        settings: settings_mod.Settings,
        clock: clock_mod.Clock,
        on_event: EventCallback,
        static: Sequence[PluginInfo] = (),
        rng: random.Random | None = None,
    ) -> None:
        self.directory = pathlib.Path(directory) if directory is not None else None
        self.role = role
        self._settings = settings
        self._clock = clock
        self._on_event = on_event
        self._static = tuple(static)
        self._rng = rng or random.Random()
        self._sockets: dict[str, _Socket] = {}
        self._logged: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.failures: dict[str, str] = {}
        """Path -> last reason a socket could not be registered (for tools and metrics)."""

    @property
    def registered(self) -> dict[str, PluginInfo]:
        """Registration socket path -> plugin, for every registered socket."""
        return {p: s.info for p, s in self._sockets.items() if s.info is not None}

    async def __aenter__(self) -> RegistryWatcher:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        for plugin in self._static:
            await self._emit(EventKind.REGISTER, plugin)
        if self.directory is not None:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            await self.scan_once()
            await self._settle_initial()
            self._task = asyncio.create_task(self._loop(), name="registry-watcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for entry in self._sockets.values():
            _cancel(entry)

    async def _settle_initial(self) -> None:
        # Sockets present at start-up are registered before start() returns,
        # so a caller's first view already holds the running drivers.
        pending = [e.task for e in self._sockets.values() if e.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=self._settings.get_info_timeout + NOTIFY_TIMEOUT)
            await self._harvest()

    async def _loop(self) -> None:
        # The scan cadence is real time (the filesystem changes in real
        # time); retry backoff is in clock time, so tests can drive it.
        while True:
            # Not asyncio.wait_for: on 3.11 it swallows our cancellation when
            # the event is set at the same moment, and close() then waits forever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.registry_poll_interval):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.scan_once()
            except Exception:
                logger.exception("scanning the plugins registry failed; retrying")

    async def scan_once(self) -> None:
        """One reconcile pass: deregister what vanished, register what is new or due."""
        assert self.directory is not None
        found = self._scan(self.directory)
        for path in list(self._sockets):
            entry = self._sockets[path]
            if found.get(path) != entry.identity:
                await self._forget(path, entry)
        for path, identity in found.items():
            self._sockets.setdefault(path, _Socket(identity))
        await self._harvest()
        self._start_due()

    # -- scanning ----------------------------------------------------------

    def _scan(self, root: pathlib.Path) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        seen_inodes: set[int] = set()
        links: list[tuple[str, tuple[int, int]]] = []
        real_root = os.path.realpath(root)
        self._scan_dir(str(root), real_root, found, seen_inodes, links, depth=0)
        # Symlinks count only after the whole tree: a link met before the
        # socket it points to must not take its place (the driver would be
        # deregistered and its devices turn Unknown until the link goes).
        for path, identity in links:
            if identity[0] not in seen_inodes:
                seen_inodes.add(identity[0])
                found[path] = identity
        return found

    def _scan_dir(
        self,
        directory: str,
        real_root: str,
        found: dict[str, tuple[int, int]],
        seen: set[int],
        links: list[tuple[str, tuple[int, int]]],
        *,
        depth: int,
    ) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.is_symlink())
        except OSError as exc:
            self._log_once(directory, f"cannot list directory: {exc.strerror}")
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if not _valid_utf8(entry.name):
                self._log_once(entry.path, "file name is not valid UTF-8")
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < _MAX_DEPTH:
                    self._scan_dir(entry.path, real_root, found, seen, links, depth=depth + 1)
                continue
            identity = self._socket_identity(entry, real_root)
            if identity is not None and entry.is_symlink():
                links.append((entry.path, identity))
            # A symlink to a socket already found is the same plugin: skip it.
            elif identity is not None and identity[0] not in seen:
                seen.add(identity[0])
                found[entry.path] = identity

    def _socket_identity(self, entry: os.DirEntry[str], real_root: str) -> tuple[int, int] | None:
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError:
            return None  # dangling symlink or a file removed mid-scan
        if not stat.S_ISSOCK(st.st_mode):
            return None
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if os.path.commonpath([target, real_root]) != real_root:
                self._log_once(entry.path, "symlink points outside the registry directory")
                return None
        return st.st_ino, st.st_ctime_ns

    # -- registering -------------------------------------------------------

    def _start_due(self) -> None:
        now = self._clock.now()
        for path, entry in self._sockets.items():
            idle = entry.info is None and entry.task is None and not entry.parked
            if idle and entry.next_try <= now:
                entry.task = asyncio.create_task(self._attempt(path), name=f"register {path}")

    async def _attempt(self, path: str) -> PluginInfo:
        try:
            return await fetch_plugin_info(
                path, role=self.role, timeout=self._settings.get_info_timeout
            )
        finally:
            self._wake.set()

    async def _harvest(self) -> None:
        for path, entry in list(self._sockets.items()):
            if entry.task is None or not entry.task.done():
                continue
            task, entry.task = entry.task, None
            try:
                info = task.result()
            except errors.RegistrationError as exc:
                self._failed(path, entry, exc)
                continue
            except Exception as exc:  # a bug or an unexpected grpc error: retry
                self._failed(path, entry, _Retryable(f"unexpected error: {exc!r}", kind="bug"))
                continue
            entry.info, entry.attempts = info, 0
            self.failures.pop(path, None)
            logger.info(
                "registered driver %s at %s (service %s, health %s)",
                info.driver,
                info.endpoint,
                info.dra_service,
                info.health_service or "none",
            )
            await self._emit(EventKind.REGISTER, info)

    def _failed(self, path: str, entry: _Socket, exc: errors.RegistrationError) -> None:
        self.failures[path] = str(exc)
        self._log_once(path, str(exc), key=getattr(exc, "kind", str(exc)))
        if not isinstance(exc, _Retryable):
            entry.parked = True  # its answers will not change until the socket does
            return
        entry.attempts += 1
        delay = min(
            self._settings.registration_backoff_initial * 2 ** (entry.attempts - 1),
            self._settings.registration_backoff_max,
        )
        entry.next_try = self._clock.now() + delay * self._rng.uniform(0.8, 1.2)

    async def _forget(self, path: str, entry: _Socket) -> None:
        del self._sockets[path]
        _cancel(entry)
        self.failures.pop(path, None)
        self._logged = {item for item in self._logged if item[0] != path}
        if entry.info is not None:
            logger.info("driver %s deregistered (%s removed or replaced)", entry.info.driver, path)
            await self._emit(EventKind.DEREGISTER, entry.info)

    async def _emit(self, kind: EventKind, plugin: PluginInfo) -> None:
        try:
            await self._on_event(PluginEvent(kind, plugin))
        except Exception:
            logger.exception("handling %s of driver %s failed", kind, plugin.driver)

    def _log_once(self, path: str, reason: str, *, key: str | None = None) -> None:
        if (path, key or reason) not in self._logged:
            self._logged.add((path, key or reason))
            logger.warning("ignoring plugin socket %s: %s", _printable(path), reason)


def _cancel(entry: _Socket) -> None:
    if entry.task is not None and not entry.task.done():
        entry.task.cancel()


def _valid_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.scandir maps undecodable bytes to lone surrogates
        return False
    return True


def _printable(path: str) -> str:
    return path.encode("utf-8", "backslashreplace").decode("utf-8")
