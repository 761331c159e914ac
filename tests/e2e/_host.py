"""The host's network as the e2e tier sees it: Debian's iptables got, the state read.

``test_e2e_host.py`` proves that the kubelet's iptables chains (``initNetworkUtil``,
``pkg/kubelet/kubelet_network_linux.go``) stay in its own network namespace. A kubelet
makes them only where an ``iptables`` command exists, and the tables it would change are
those of every earlier kubelet of the session too: so when that test is selected,
``conftest.py`` gets Debian's ``iptables`` here and reads the host's state before the
session's first kubelet starts (:func:`state`), and the test compares the host with it.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess

#: Debian's package with iptables-save and ip6tables-save (and the iptables the kubelet runs).
PACKAGE = "iptables"
TOOLS = ("iptables", "iptables-save", "ip6tables-save")
COUNTERS = re.compile(r"\[\d+:\d+\]")


class Unavailable(Exception):
    """The tools are missing and cannot be installed here."""


def ensure_iptables() -> None:
    """apt-get install Debian's iptables where a tool is missing (as tests/image does)."""
    if all(shutil.which(tool) for tool in TOOLS):
        return
    if shutil.which("apt-get") is None:
        raise Unavailable(f"no {', '.join(TOOLS)} and no apt-get to install Debian's {PACKAGE}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ("-o", "DPkg::Lock::Timeout=300")  # another tox env may be installing too
    for argv in (
        ["apt-get", *lock, "update", "-q"],
        ["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", PACKAGE],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)}:\n{done.stdout[-2000:]}{done.stderr}")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise AssertionError(f"Debian's {PACKAGE} did not bring {missing}")


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {done.stderr}")
    return done.stdout


def tables(prefix: tuple[str, ...] = ()) -> dict[str, str]:
    """What ``iptables-save`` and ``ip6tables-save`` print (after ``prefix``, e.g. an
    ``nsenter``), without comments or counters: both change with time and traffic."""
    found = {}
    for tool in ("iptables-save", "ip6tables-save"):
        lines = _run([*prefix, tool]).splitlines()
        found[tool] = "\n".join(COUNTERS.sub("[-]", x) for x in lines if not x.startswith("#"))
    return found


def state() -> dict[str, str]:
    """The host's tables and addresses."""
    return {**tables(), "ip -br addr": _run(["ip", "-br", "addr"])}


def diff(before: dict[str, str], after: dict[str, str]) -> str:
    out = []
    for key, was in before.items():
        if was != after[key]:
            lines = difflib.unified_diff(
                was.splitlines(), after[key].splitlines(), "before", "after", lineterm=""
            )
            out.append(f"{key}:\n" + "\n".join(lines))
    return "\n".join(out)
