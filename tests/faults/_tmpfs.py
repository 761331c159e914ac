"""A size-limited tmpfs mounted on a state directory, for the disk faults and the soak.

Root only (``mount -t tmpfs``); remounted ``ro`` for a read-only disk, filled for a full one.
"""

from __future__ import annotations

import pathlib
import subprocess


class Tmpfs:
    """A size-limited tmpfs mounted on ``path``, unmounted however the test ends.

    The pipeline runs in this process, its store in worker threads: a mount in
    a private namespace (``unshare -m``) would not be theirs, and reaching one
    through ``/proc/<pid>/root`` does not work because SQLite resolves that
    link to ``/`` and opens the file beneath the mount. So the mount is in
    this process's namespace, and a watchdog shell (reading its stdin, a pipe
    from here) unmounts it when this process goes away, even by SIGKILL; the
    normal end unmounts it at once.
    """

    def __init__(self, path: pathlib.Path, size: str) -> None:
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)],
            capture_output=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            raise NotPermitted(done.stderr.decode(errors="replace").strip() or "no reason given")
        self._watchdog = subprocess.Popen(
            ["sh", "-c", 'read _; umount -l "$1" 2>/dev/null', "sh", str(path)],
            stdin=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip

    def remount(self, mode: str) -> None:
        """``ro`` or ``rw``."""
        done = subprocess.run(
            ["mount", "-o", f"remount,{mode}", str(self.path)], capture_output=True, check=False
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], capture_output=True, check=False)
        assert self._watchdog.stdin is not None
        self._watchdog.stdin.close()
        self._watchdog.wait(timeout=10)


class NotPermitted(Exception):
    """The mount failed (no right to mount): its own words."""
