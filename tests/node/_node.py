"""One real node: containerd and runc run the pods, beside the real kubelet.

Everything runs inside one private mount namespace (:class:`MountNamespace`), so that the
kubelet's volume mounts, containerd's overlay mounts and the shims all see one another and
the host sees none of them. The namespace is held by a ``sleep`` process; containerd and the
kubelet are started in it with ``nsenter``, so that each can be stopped or SIGKILLed on its
own. In it, as in ``tests/e2e``: files over the six ``/proc/sys`` entries the kubelet checks,
tmpfs over ``/var/lib`` and ``/var/log``; and tmpfs over ``/run``, so that no default path of
containerd or runc reaches the host's ``/run`` (the configuration names its own anyway).

:class:`NodeKubelet` is the e2e tier's :class:`tests.e2e._node.Kubelet` with containerd
(``tests/node/_containerd.py``) in place of the fake CRI and the two local images imported
(``tests/node/_images.py``). Its :meth:`NodeKubelet.stop` kills and deletes every container
through containerd, so runc removes their cgroups, before containerd and the namespace go,
then the ``k8s.io`` cgroup parents containerd made (if empty).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.e2e import _node as e2e_node
from tests.interop._apiserver import KubeApiServer
from tests.node import _containerd, _images


@dataclasses.dataclass(frozen=True)
class RuntimeBinaries:
    """containerd, ctr, the runc shim and runc (all built by tests/interop/_build.py)."""

    containerd: Path
    ctr: Path
    shim: Path
    runc: Path


class MountNamespace:
    """A private mount namespace held open by a ``sleep``; see the module docstring."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.ready = workdir / "namespace-ready"
        self._holder: e2e_node._Process | None = None

    def _mounts(self) -> list[str]:
        mounts = []
        sysctl = self.workdir / "sysctl"
        sysctl.mkdir(parents=True, exist_ok=True)
        for key, value in e2e_node.SYSCTLS.items():
            faked = sysctl / key.replace("/", ".")
            faked.write_text(f"{value}\n")
            mounts.append(f"mount --bind {faked} /proc/sys/{key}")
        mounts += [
            "mount -t tmpfs -o size=64m node-varlib /var/lib",
            "mount -t tmpfs -o size=64m node-varlog /var/log",
            "mount -t tmpfs -o size=64m node-run /run",
            f"touch {self.ready}",
        ]
        return mounts

    @property
    def pid(self) -> int:
        assert self._holder is not None
        return self._holder.proc.pid

    def alive(self) -> bool:
        return self._holder is not None and self._holder.alive()

    def start(self) -> None:
        self.ready.unlink(missing_ok=True)
        script = " && ".join([*self._mounts(), "exec sleep infinity"])
        self._holder = e2e_node._Process(
            "namespace",
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
            self.workdir / "namespace.log",
        )
        deadline = time.monotonic() + 30
        while not self.ready.exists():
            if not self._holder.alive() or time.monotonic() > deadline:
                raise AssertionError(f"the mount namespace failed:\n{self._holder.tail()}")
            time.sleep(0.05)

    def enter(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the namespace."""
        return ["nsenter", "-t", str(self.pid), "-m", "--", *argv]

    def members(self) -> list[int]:
        """Processes in the namespace other than its holder (shims, containers)."""
        mine = os.readlink(f"/proc/{self.pid}/ns/mnt")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == self.pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry}/ns/mnt") == mine:
                    found.append(int(entry))
        return found

    def stop(self) -> None:
        if self._holder is not None:
            self._holder.stop()


class Containerd:
    """containerd in the namespace, its images imported; ``ctr`` for the tests' own look."""

    def __init__(
        self, bins: RuntimeBinaries, namespace: MountNamespace, layout: _containerd.Layout,
        images: Sequence[_images.Image],
    ) -> None:  # fmt: skip
        self.bins, self.namespace, self.layout = bins, namespace, layout
        self.images = list(images)
        self.proc: e2e_node._Process | None = None
        _containerd.write_config(layout, runc=str(bins.runc), sandbox_image=self.images[0].name)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.layout.socket}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def start(self, timeout: float = 60.0) -> None:
        self.layout.socket.unlink(missing_ok=True)
        env_path = f"{self.bins.shim.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        argv = ["env", f"PATH={env_path}", str(self.bins.containerd),
                f"--config={self.layout.config}"]  # fmt: skip
        self.proc = e2e_node._Process(
            "containerd", self.namespace.enter(argv), self.layout.run / "containerd.log"
        )
        deadline = time.monotonic() + timeout
        while self.ctr("version", check=False).returncode != 0:
            if not self.proc.alive() or time.monotonic() > deadline:
                raise AssertionError(f"containerd did not start:\n{self.proc.tail()}")
            time.sleep(0.1)
        for image in self.images:
            self.ctr("images", "import", str(image.archive))

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bins.ctr), f"--address={self.layout.socket}",
                f"--namespace={_containerd.NAMESPACE}", *args]  # fmt: skip
        done = subprocess.run(
            self.namespace.enter(argv), capture_output=True, text=True, check=False, timeout=60
        )
        if check and done.returncode != 0:
            raise AssertionError(f"ctr {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done

    def containers(self) -> list[str]:
        return self.ctr("containers", "list", "--quiet").stdout.split()

    def remove_all(self) -> None:
        """Kill and delete every task and container (runc then removes their cgroups)."""
        for cid in self.ctr("tasks", "list", "--quiet", check=False).stdout.split():
            self.ctr("tasks", "kill", "--all", "--signal=SIGKILL", cid, check=False)
        for cid in self.ctr("tasks", "list", "--quiet", check=False).stdout.split():
            self.ctr("tasks", "delete", "--force", cid, check=False)
        for cid in self.ctr("containers", "list", "--quiet", check=False).stdout.split():
            self.ctr("containers", "delete", cid, check=False)

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


#: Where containerd puts a pod's cgroups when the kubelet gives no parent (cgroupsPerQOS off):
#: ``/k8s.io/<id>`` below each hierarchy. runc removes the ``<id>`` cgroups as containers go.
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "k8s.io"


def cgroup_parents() -> set[Path]:
    """The ``k8s.io`` cgroup directories that exist now, one per hierarchy."""
    return set(CGROUP_ROOT.glob(f"*/{CGROUP_PARENT}")) | set(CGROUP_ROOT.glob(CGROUP_PARENT))


class NodeKubelet(e2e_node.Kubelet):
    """The e2e tier's kubelet on containerd in a shared mount namespace."""

    def __init__(
        self,
        *,
        kubelet_bin: Path,
        bins: RuntimeBinaries,
        images: Sequence[_images.Image],
        server: KubeApiServer,
        workdir: Path,
        spec: e2e_node.KubeletSpec,
    ) -> None:
        self.namespace = MountNamespace(workdir)
        self.layout = _containerd.Layout(workdir / "containerd")
        super().__init__(kubelet_bin=kubelet_bin, fakecri_bin=bins.containerd, server=server,
                         workdir=workdir, spec=spec)  # fmt: skip
        self.containerd = Containerd(bins, self.namespace, self.layout, images)
        self._cgroups_before = cgroup_parents()

    @property
    def cdi_dir(self) -> Path:
        return self.layout.cdi

    def _write_config(self) -> Path:
        path = super()._write_config()
        config = json.loads(path.read_text())
        endpoint = f"unix://{self.layout.socket}"
        config["containerRuntimeEndpoint"] = config["imageServiceEndpoint"] = endpoint
        path.write_text(json.dumps(config, indent=2) + "\n")
        return path

    def _argv(self) -> list[str]:
        return [
            str(self.bin), f"--config={self.config}", f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root}", f"--cert-dir={self.workdir / 'pki'}",
            f"--hostname-override={self.node}", "--v=2",
        ]  # fmt: skip

    def start(self, timeout: float = 120.0) -> None:
        """Start the namespace and containerd (if needed), then the kubelet; wait for Ready."""
        if not self.namespace.alive():
            self.namespace.start()
        if not self.containerd.alive():
            self.containerd.start()
        started = time.time()
        self._kubelet = e2e_node._Process(
            "kubelet", self.namespace.enter(self._argv()), self.workdir / "kubelet.log"
        )
        self._wait(lambda: self._ready_since(started), timeout, "the Node to be Ready")

    def kill_containerd(self) -> None:
        self.containerd.kill()

    def stop(self) -> None:
        if self._kubelet is not None:
            self._kubelet.stop()
        if self.namespace.alive():
            if self.containerd.alive():
                self.containerd.remove_all()
            self.containerd.stop()
            for pid in self.namespace.members():  # shims left after a containerd SIGKILL
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.namespace.stop()
        for made in sorted(cgroup_parents() - self._cgroups_before):
            with contextlib.suppress(OSError):  # not empty: another node's pods are in it
                made.rmdir()
