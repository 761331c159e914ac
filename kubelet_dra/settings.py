"""Every default in one place: pydantic-settings for flags and environment.

The sidecar's flags (``cli.py``) map onto these fields one to one and each
field also reads its environment variable (``NODE_NAME``, ``KUBECONFIG``,
``KUBELET_DRA_*``). Library users build a :class:`Settings` directly.
Kubelet counterparts are named where a default comes from the kubelet.
"""

from __future__ import annotations

import enum
import pathlib

import pydantic
import pydantic_settings

from kubelet_dra.taints import planner


class ContainerStatusMode(enum.StrEnum):
    """Whether to write ``containerStatuses[].allocatedResourcesStatus``."""

    AUTO = "auto"  # write unless the node's kubelet already does
    ON = "on"
    OFF = "off"


class TaintEffect(enum.StrEnum):
    """``--taint-effect``: the taint bridge's effect, or ``off`` (no DeviceTaintRules)."""

    OFF = "off"
    NONE = "None"
    NO_SCHEDULE = "NoSchedule"
    NO_EXECUTE = "NoExecute"


class Role(enum.StrEnum):
    """How we take part in plugin registration."""

    OBSERVER = "observer"  # never calls NotifyRegistrationStatus (the sidecar)
    OWNER = "owner"  # acts as the kubelet and answers NotifyRegistrationStatus


def _env(name: str) -> pydantic.AliasChoices:
    return pydantic.AliasChoices(name)


class Settings(pydantic_settings.BaseSettings):
    """Configuration of the pipeline; see ``docs/sidecar.md`` for each field."""

    model_config = pydantic_settings.SettingsConfigDict(
        env_prefix="KUBELET_DRA_", populate_by_name=True, extra="forbid", frozen=True
    )

    node_name: str = pydantic.Field(default="", validation_alias=_env("NODE_NAME"))
    kubeconfig: pathlib.Path | None = pydantic.Field(
        default=None, validation_alias=_env("KUBECONFIG")
    )
    plugins_registry: pathlib.Path = pathlib.Path("/var/lib/kubelet/plugins_registry")
    state_dir: pathlib.Path = pathlib.Path("/var/lib/kubelet-dra-health")
    # The kubelet's PodResources API (state.podresources): the CDI device IDs the
    # kubelet names devices by. None or "": not read (names are <driver>/<pool>/<device>).
    pod_resources_socket: pathlib.Path | None = pathlib.Path(
        "/var/lib/kubelet/pod-resources/kubelet.sock"
    )
    # A library option for harnesses without that socket: the kubelet's --root-dir, whose
    # DRA checkpoint dra_manager_state is polled (kubeletcheckpoint). `run` never sets it.
    kubelet_root_dir: pathlib.Path | None = None
    kubelet_checkpoint_interval: float = pydantic.Field(default=2.0, gt=0)
    # ``auto`` beside a kubelet (its PodResources socket answers): how long a pod's first field
    # write waits for the kubelet's own entries. Two of its 10 s status reconciles.
    kubelet_field_grace: float = pydantic.Field(default=20.0, ge=0)
    # kubelet DefaultHealthTimeout; a device's positive health_check_timeout_seconds wins.
    health_timeout: float = pydantic.Field(default=30.0, gt=0)
    container_status: ContainerStatusMode = ContainerStatusMode.AUTO
    pod_condition_type: str = "DeviceHealthy"
    metrics_address: str = "127.0.0.1:9464"
    role: Role = Role.OBSERVER
    # glibc malloc_trim every this many seconds in `run` (memtrim); 0 = never.
    malloc_trim_interval: float = pydantic.Field(default=60.0, ge=0)
    # glibc malloc arenas at most in `run` (memtrim.cap_arenas); 0 = glibc's own 8 per core.
    malloc_arena_max: int = pydantic.Field(default=2, ge=0)
    # glibc's trim threshold in `run`, fixed (memtrim.fix_trim_threshold); 0 = glibc's dynamic one.
    malloc_trim_threshold: int = pydantic.Field(default=128 * 1024, ge=0)

    # Registration (kubelet pluginmanager: GetInfo 1 s, reconcile every 1 s).
    get_info_timeout: float = pydantic.Field(default=1.0, gt=0)
    registry_poll_interval: float = pydantic.Field(default=0.5, gt=0)
    registration_backoff_initial: float = pydantic.Field(default=0.5, gt=0)
    registration_backoff_max: float = pydantic.Field(default=120.0, gt=0)

    # Health streams. The kubelet retries every 5 s with no backoff.
    stream_backoff_initial: float = pydantic.Field(default=1.0, gt=0)
    stream_backoff_max: float = pydantic.Field(default=30.0, gt=0)
    stream_backoff_reset_after: float = pydantic.Field(default=60.0, gt=0)
    max_message_bytes: int = pydantic.Field(default=16 * 1024 * 1024, gt=0)
    max_devices_per_report: int = pydantic.Field(default=100_000, gt=0)

    # Status writer (kubelet kube-api-qps 50, burst 100).
    write_window: float = pydantic.Field(default=0.05, ge=0)
    api_qps: float = pydantic.Field(default=50.0, gt=0)
    api_burst: int = pydantic.Field(default=100, gt=0)
    # Pod status writes in flight at once per node (bounded because a rack failure at
    # 5,000 nodes puts rack nodes x this many writes in flight; docs/scaling.md).
    write_concurrency: int = pydantic.Field(default=8, gt=0)
    # Pods per page when the pod watch lists again (kube.pods._relist): a relist is
    # decoded a page at a time, so its short-lived objects stay one page's worth
    # (docs/memory.md). 0: the whole list in one answer.
    pod_list_page_size: int = pydantic.Field(default=10, ge=0)
    terminated_pod_ttl: float = pydantic.Field(default=600.0, ge=0)
    terminated_pod_max: int = pydantic.Field(default=1000, ge=0)
    event_interval: float = pydantic.Field(default=60.0, ge=0)

    # After a (re)start, pod writes wait until every registered driver's stream
    # delivered its first report (or failed), at most this long: a device
    # reported just before a crash but not yet committed must not flash
    # Unknown in pod status while its driver reconnects.
    startup_grace: float = pydantic.Field(default=5.0, ge=0)

    # Persistence: how often staged records are committed.
    store_flush_interval: float = pydantic.Field(default=0.2, gt=0)

    # The taint bridge (docs/remediation.md): off unless an effect is chosen.
    taint_effect: TaintEffect = TaintEffect.OFF
    taint_after: float = pydantic.Field(default=10.0, ge=0)
    taint_unknown_after: float | None = pydantic.Field(default=None, ge=0)  # None: never
    untaint_after: float = pydantic.Field(default=60.0, ge=0)
    taint_key: str = "kubelet-dra.io/unhealthy"
    # A relist of the node's rules corrects what others changed meanwhile.
    taint_resync_interval: float = pydantic.Field(default=300.0, gt=0)

    @pydantic.field_validator("taint_unknown_after", mode="before")
    @classmethod
    def _never(cls, value: object) -> object:
        # An empty environment variable, or the word, means the default: never.
        if isinstance(value, str) and value.strip().lower() in ("", "never"):
            return None
        return value

    @pydantic.field_validator("kubelet_root_dir", "pod_resources_socket", mode="before")
    @classmethod
    def _no_dir(cls, value: object) -> object:
        # An empty flag or environment variable turns the source off.
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @pydantic.field_validator("taint_key")
    @classmethod
    def _label_name(cls, value: str) -> str:
        if not planner.valid_taint_key(value):
            raise ValueError(
                "must be a label name ([prefix/]name, name at most 63 characters, "
                "prefix a DNS subdomain)"
            )
        return value
