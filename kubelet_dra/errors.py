"""The errors kubelet-dra raises, as one shallow tree::

    KubeletDraError
    ├── ConfigError          bad flags, settings or kubeconfig (the CLI exits 2)
    ├── RegistrationError    a plugin socket that cannot be registered
    ├── StoreError           the persistent health cache cannot be used
    ├── CheckpointError      the kubelet's DRA checkpoint cannot be used (reason in .reason)
    └── ApiError             the Kubernetes API failed; .status is the HTTP code
        └── PodGone          the pod no longer exists (writes to it stop)

Foreign exceptions (grpc, kubernetes, sqlite3) are re-raised as one of these with the
original chained as ``__cause__``, after :func:`drop_frames`, so callers never import the
libraries we wrap and a failure leaves no reference cycle behind.
"""

from __future__ import annotations

import traceback


class KubeletDraError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(KubeletDraError):
    """Invalid configuration: flags, environment, settings or kubeconfig."""


class RegistrationError(KubeletDraError):
    """A plugin could not be registered (bad type, name, endpoint, versions, socket).

    ``reason`` names a refusal for metrics (``driver_name``, ``endpoint``,
    ``plugin_type``, ``supported_versions``); empty for other failures.
    """

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class StoreError(KubeletDraError):
    """The on-disk health cache could not be opened, read or written."""


class CheckpointError(KubeletDraError):
    """The kubelet's DRA checkpoint (``dra_manager_state``) cannot be used.

    ``reason`` names the refusal for metrics (``kubeletcheckpoint.REASONS``).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class ApiError(KubeletDraError):
    """A Kubernetes API request failed."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class PodGone(ApiError):
    """The pod was deleted (404) or replaced by another with the same name."""


def drop_frames(exc: BaseException | None) -> None:
    """Clear the local variables of the finished frames in ``exc``'s tracebacks.

    A failed request leaves a reference cycle: the exception holds its traceback,
    the traceback its frames, and a frame a local that holds the exception again
    (urllib3's retry loop keeps the error it re-raises; tenacity's retry state keeps
    the outcome). Such a cycle is freed only by a garbage collection, and until
    then it pins whatever the frames hold: in an API outage, 54 objects for each
    failed call and about 70 more for each retry round (docs/memory.md). Memory
    allocated meanwhile lands beside them, which is how a 20-second outage left
    the sidecar a megabyte of CPython arenas. With the locals cleared the chain
    dies with its last reference, and the traceback still names every line (only
    the values of the locals are gone). Frames still running are skipped;
    ``__cause__`` and ``__context__`` are followed.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
