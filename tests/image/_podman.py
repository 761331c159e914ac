"""podman for the image tests, on this machine's kind of host and on a plain one.

Two adjustments, each only where the host needs it, so the flags of the run stay those of
the DaemonSet (read-only root filesystem, every capability dropped, no new privileges):

- a hybrid cgroup layout with a controller on the v2 hierarchy (crun refuses it: "cgroups in
  hybrid mode not supported"): podman runs in a mount namespace of its own without
  ``/sys/fs/cgroup/unified``, with ``--cgroups=disabled``;
- hard limits below podman's defaults for root (RLIMIT_NOFILE 1048576): explicit
  ``--ulimit`` values under them, since crun cannot raise a limit without CAP_SYS_RESOURCE.
"""

from __future__ import annotations

import pathlib
import resource
import shlex
import shutil
import subprocess
from collections.abc import Sequence

UNIFIED = pathlib.Path("/sys/fs/cgroup/unified")


def missing() -> str | None:
    """Why podman cannot run here, or None."""
    for tool in ("podman", "crun", "skopeo"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman crun skopeo)"
    return None


def _hybrid() -> bool:
    controllers = UNIFIED / "cgroup.controllers"
    return controllers.exists() and bool(controllers.read_text().split())


def run_flags() -> list[str]:
    """Flags ``podman run`` needs on this host (none on a plain cgroup v2 host)."""
    flags = ["--cgroups=disabled"] if _hybrid() else []
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if nofile != resource.RLIM_INFINITY and nofile < 1048576:
        flags += [f"--ulimit=nofile={nofile}:{nofile}", "--ulimit=nproc=4096:4096"]
    return flags


def argv(args: Sequence[str]) -> list[str]:
    command = ["podman", *args]
    if not _hybrid():
        return command
    script = f"umount {UNIFIED} && exec {shlex.join(command)}"
    return ["unshare", "--mount", "sh", "-c", script]


def podman(
    *args: str, check: bool = True, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv(args), capture_output=True, text=True, check=check, timeout=timeout)
