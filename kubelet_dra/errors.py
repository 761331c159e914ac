"""The errors kubelet-dra raises, as one shallow tree.

::

    KubeletDraError
    ├── ConfigError          bad flags, settings or kubeconfig (the CLI exits 2)
    ├── RegistrationError    a plugin socket that cannot be registered
    ├── StoreError           the persistent health cache cannot be used
    ├── CheckpointError      the kubelet's DRA checkpoint cannot be used (reason in .reason)
    └── ApiError             the Kubernetes API failed; .status is the HTTP code
        └── PodGone          the pod no longer exists (writes to it stop)

Foreign exceptions (grpc, kubernetes, sqlite3) are re-raised as one of these
with the original chained as ``__cause__``, so callers never import the
libraries we wrap to catch our failures.
"""

from __future__ import annotations


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
