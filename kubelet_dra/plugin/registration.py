"""Plugin discovery: the registry watcher.

Counterpart of the kubelet's ``pkg/kubelet/pluginmanager`` (plugin watcher, reconciler,
operation generator). Its two parts have modules of their own: ``getinfo`` (one socket's
``GetInfo``, version negotiation, ``NotifyRegistrationStatus``) and ``validation`` (the
driver name and endpoint checks of ``pkg/kubelet/cm/dra/plugin/dra_plugin_manager.go``).
:class:`RegistryWatcher` polls the plugins registry and delivers events in order; as an
observer (the sidecar) it never disturbs the real kubelet's registration.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import enum
import errno
import logging
import os
import pathlib
import random
import stat
from collections.abc import Awaitable, Callable, Sequence

from kubelet_dra import clock as clock_mod
from kubelet_dra import errors
from kubelet_dra import settings as settings_mod
from kubelet_dra.plugin import getinfo
from kubelet_dra.plugin.getinfo import PluginInfo
from kubelet_dra.plugin.validation import printable

logger = logging.getLogger(__name__)

_MAX_DEPTH = 8  # the registry is shallow; a bound keeps a pathological tree cheap
IGNORED_REASONS = (
    "not_a_socket",
    "unreachable",
    "symlink_loop",
    "outside_registry",
    "not_utf8",
    "too_deep",
)
"""Why a scan passes over a registry entry: a regular file, FIFO or directory
link; a dangling symlink (or one removed mid-scan); a symlink loop; a symlink to
a socket outside the registry; a name that is not UTF-8; a directory below
:data:`_MAX_DEPTH`. Hidden (dot) entries are not counted."""


class EventKind(enum.StrEnum):
    REGISTER = "register"
    DEREGISTER = "deregister"


@dataclasses.dataclass(frozen=True, slots=True)
class PluginEvent:
    kind: EventKind
    plugin: PluginInfo


EventCallback = Callable[[PluginEvent], Awaitable[None]]


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

    Validation follows kubelet v1.38 (``dra_plugin_manager.go``): the driver
    name must pass ``ValidateCSIDriverName`` and the endpoint must be an
    absolute, plain path shorter than 108 bytes (see ``validation``). A refused
    registration is an error to the plugin (as owner, through
    ``NotifyRegistrationStatus``), logged once per socket and counted in
    :attr:`RegistryWatcher.refused`.

    Roles: an **observer** (the sidecar) only calls ``GetInfo`` and never
    ``NotifyRegistrationStatus``, so it cannot disturb the real kubelet's
    registration; an **owner** acts as the kubelet and notifies the plugin.
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
        self.refused: collections.Counter[str] = collections.Counter()
        """Reason -> registrations refused by validation (``driver_name``,
        ``endpoint``, ``plugin_type``, ``supported_versions``), once per socket."""
        self.attempt_failures: collections.Counter[str] = collections.Counter()
        """gRPC code (or ``bug``) -> registration attempts that failed and will be
        retried: a socket that never answers ``GetInfo`` counts ``DEADLINE_EXCEEDED``
        once per attempt (its backoff doubles up to ``registration_backoff_max``)."""
        self.ignored: dict[str, int] = dict.fromkeys(IGNORED_REASONS, 0)
        self._ignoring = dict(self.ignored)  # the counts of the scan under way
        """Reason -> entries of the registry the last scan passed over (see
        :data:`IGNORED_REASONS`)."""

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
            await asyncio.wait(
                pending, timeout=self._settings.get_info_timeout + getinfo.NOTIFY_TIMEOUT
            )
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
        ignored = self._ignoring = dict.fromkeys(IGNORED_REASONS, 0)
        self._scan_dir(str(root), real_root, found, seen_inodes, links, depth=0)
        if ignored != self.ignored and any(ignored.values()):
            logger.info(
                "plugins registry %s: passing over %s",
                root,
                ", ".join(f"{n} {reason}" for reason, n in ignored.items() if n),
            )
        self.ignored = ignored
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
        ignored = self._ignoring
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
                ignored["not_utf8"] += 1
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < _MAX_DEPTH:
                    self._scan_dir(entry.path, real_root, found, seen, links, depth=depth + 1)
                else:
                    ignored["too_deep"] += 1
                continue
            identity = self._socket_identity(entry, real_root)
            if identity is not None and entry.is_symlink():
                links.append((entry.path, identity))
            # A symlink to a socket already found is the same plugin: skip it.
            elif identity is not None and identity[0] not in seen:
                seen.add(identity[0])
                found[entry.path] = identity

    def _socket_identity(self, entry: os.DirEntry[str], real_root: str) -> tuple[int, int] | None:
        ignored = self._ignoring
        try:
            st = entry.stat(follow_symlinks=True)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._log_once(entry.path, "symlink loop")
                ignored["symlink_loop"] += 1
            else:
                ignored["unreachable"] += 1  # dangling symlink or a file removed mid-scan
            return None
        if not stat.S_ISSOCK(st.st_mode):
            ignored["not_a_socket"] += 1
            return None
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if os.path.commonpath([target, real_root]) != real_root:
                self._log_once(entry.path, "symlink points outside the registry directory")
                ignored["outside_registry"] += 1
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
            return await getinfo.fetch_plugin_info(
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
                self._failed(
                    path, entry, getinfo.Retryable(f"unexpected error: {exc!r}", kind="bug")
                )
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
        if not isinstance(exc, getinfo.Retryable):
            entry.parked = True  # its answers will not change until the socket does
            self.refused[exc.reason or "other"] += 1
            return
        self.attempt_failures[getattr(exc, "kind", "other")] += 1
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
            logger.warning("ignoring plugin socket %s: %s", printable(path), reason)


def _cancel(entry: _Socket) -> None:
    if entry.task is not None and not entry.task.done():
        entry.task.cancel()


def _valid_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # os.scandir maps undecodable bytes to lone surrogates
        return False
    return True
