"""containerd 2.x with its CRI plugin and runc, all of its state inside one run directory.

:func:`config_toml` writes the configuration (version 3) the node tier runs with: root, state,
sockets, runc's root, the shims' sockets, CDI specs and the CNI configuration all under the run
dir; the sandbox image pinned to the local pause image; the plugins that would reach for
host paths or other filesystems (btrfs, zfs, devmapper, NRI, tracing) left out. CDI is always
on in containerd 2.x; ``cdi_spec_dirs`` points it at the run dir's ``cdi``. Where this process
lacks CAP_SYS_RESOURCE (some VMs' root does), ``restrict_oom_score_adj`` keeps the kubelet's
negative ``oom_score_adj`` from failing every container's start (runc cannot lower it).

Pods use ``hostNetwork: true``; no CNI plugin ever runs. A loopback network list (CNI 1.0.0,
whose STATUS containerd does not call) is still written, because without any network
configuration the CRI plugin reports ``NetworkReady=false`` and the kubelet keeps the Node
NotReady. There is no plugin binary in ``bin_dirs``: a pod without host networking fails to
start instead of getting a network, so no pod traffic can leave the machine.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

#: Plugins left out: snapshotters of filesystems not used here, NRI (its socket is a fixed
#: host path), tracing (nothing collects it).
DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.erofs",
    "io.containerd.nri.v1.nri",
    "io.containerd.tracing.processor.v1.otlp",
    "io.containerd.internal.v1.tracing",
)
NAMESPACE = "k8s.io"  # the containerd namespace of the CRI plugin
CAP_SYS_RESOURCE = 24


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where containerd keeps everything, all below ``run``."""

    run: Path

    @property
    def root(self) -> Path:
        return self.run / "root"

    @property
    def state(self) -> Path:
        return self.run / "state"

    @property
    def socket(self) -> Path:
        return self.run / "containerd.sock"

    @property
    def cdi(self) -> Path:
        return self.run / "cdi"

    @property
    def cni_conf(self) -> Path:
        return self.run / "cni" / "net.d"

    @property
    def cni_bin(self) -> Path:
        return self.run / "cni" / "bin"

    @property
    def runc_root(self) -> Path:
        return self.run / "runc"

    @property
    def shim_sockets(self) -> Path:
        return self.run / "s"

    @property
    def config(self) -> Path:
        return self.run / "config.toml"

    def make(self) -> None:
        for path in (self.root, self.state, self.cdi, self.cni_conf, self.cni_bin,
                     self.runc_root, self.shim_sockets):  # fmt: skip
            path.mkdir(parents=True, exist_ok=True)


def _q(value: object) -> str:
    return json.dumps(str(value))  # a TOML basic string is a JSON string


def config_toml(layout: Layout, *, runc: str, sandbox_image: str, restrict_oom: bool) -> str:
    """containerd's config.toml (version 4: the servers are plugins) for ``layout``."""
    disabled = ", ".join(_q(p) for p in DISABLED_PLUGINS)
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    runc_table = f"{runtime}.containerd.runtimes.runc"
    return f"""\
version = 4
root = {_q(layout.root)}
state = {_q(layout.state)}
disabled_plugins = [{disabled}]
imports = [{_q(layout.run / "conf.d" / "*.toml")}]

[plugins."io.containerd.server.v1.grpc"]
  address = {_q(layout.socket)}

[plugins."io.containerd.server.v1.ttrpc"]
  address = {_q(layout.run / "containerd.sock.ttrpc")}

[plugins."io.containerd.server.v1.debug"]
  address = ""

[plugins."io.containerd.server.v1.metrics"]
  address = ""

[plugins."io.containerd.shim.v1.manager"]
  socket_dir = {_q(layout.shim_sockets)}

[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = {_q(sandbox_image)}

[{runtime}]
  cdi_spec_dirs = [{_q(layout.cdi)}]
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = {"true" if restrict_oom else "false"}

[{runtime}.cni]
  bin_dirs = [{_q(layout.cni_bin)}]
  conf_dir = {_q(layout.cni_conf)}
  max_conf_num = 1

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runc_table}]
  runtime_type = "io.containerd.runc.v2"

[{runc_table}.options]
  BinaryName = {_q(runc)}
  Root = {_q(layout.runc_root)}
  SystemdCgroup = false
"""


LOOPBACK_CONFLIST = {
    "cniVersion": "1.0.0",
    "name": "kubelet-dra-loopback",
    "plugins": [{"type": "loopback"}],
}


def can_lower_oom_score() -> bool:
    """Whether this process holds CAP_SYS_RESOURCE (bit 24), which lowering
    ``oom_score_adj`` (the kubelet asks -998 for a sandbox) needs."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    return False


def write_config(layout: Layout, *, runc: str, sandbox_image: str) -> Path:
    layout.make()
    (layout.cni_conf / "10-loopback.conflist").write_text(json.dumps(LOOPBACK_CONFLIST) + "\n")
    config = config_toml(
        layout, runc=runc, sandbox_image=sandbox_image, restrict_oom=not can_lower_oom_score()
    )
    layout.config.write_text(config)
    return layout.config
