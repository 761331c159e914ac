"""The host left unchanged: the kubelet's iptables rules stay in its own network namespace.

Wherever an ``iptables`` command exists, the kubelet's ``initNetworkUtil``
(``pkg/kubelet/kubelet_network_linux.go``) makes chains in the tables of the network it runs
in: ``KUBE-IPTABLES-HINT`` (mangle), ``KUBE-FIREWALL`` with a DROP rule for packets to
127.0.0.0/8 from elsewhere, jumped to from INPUT and OUTPUT (filter), and the
``KUBE-KUBELET-CANARY`` chains it watches. The e2e kubelet runs in a network namespace of
its own (``_node.py``). This test gets Debian's ``iptables`` where it is missing, so that
the kubelet has one to run; restarts the kubelet; waits until it says that it initialized
its rules; and compares the host's ``iptables-save``, ``ip6tables-save`` and addresses
before and after. It also reads the kubelet's namespace, where the chains must be: a
comparison the kubelet had no reason to break would prove nothing.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import time

import pytest

#: Debian's package with iptables-save and ip6tables-save (and the iptables the kubelet runs).
PACKAGE = "iptables"
TOOLS = ("iptables", "iptables-save", "ip6tables-save")
#: What the kubelet's log says once per family after initNetworkUtil made its chains.
INITIALIZED = re.compile(r'Initialized iptables rules\.?"? protocol="?(IPv4|IPv6)')
COUNTERS = re.compile(r"\[\d+:\d+\]")


def _install() -> None:
    """apt-get install the package (as tests/deploy and the image build get theirs)."""
    if shutil.which("apt-get") is None:
        pytest.skip(f"no {', '.join(TOOLS)} and no apt-get to install Debian's {PACKAGE}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    lock = ("-o", "DPkg::Lock::Timeout=300")  # another tox env may be installing too
    for argv in (
        ["apt-get", *lock, "update", "-q"],
        ["apt-get", *lock, "install", "-y", "-q", "--no-install-recommends", PACKAGE],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-2000:]}{done.stderr}"


@pytest.fixture(scope="module")
def iptables() -> None:
    if any(shutil.which(tool) is None for tool in TOOLS):
        _install()
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    assert not missing, f"Debian's {PACKAGE} did not bring {missing}"


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"
    return done.stdout


def tables(prefix: tuple[str, ...] = ()) -> dict[str, str]:
    """What ``iptables-save`` and ``ip6tables-save`` print, without comments or counters
    (both change with time and traffic, not with rules)."""
    found = {}
    for tool in ("iptables-save", "ip6tables-save"):
        lines = _run([*prefix, tool]).splitlines()
        found[tool] = "\n".join(COUNTERS.sub("[-]", x) for x in lines if not x.startswith("#"))
    return found


def host_state() -> dict[str, str]:
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


def test_kubelet_leaves_the_hosts_iptables_unchanged(iptables, line, kubelet_on):
    kubelet = kubelet_on(line, True)
    before = host_state()
    kubelet.restart()  # after the install: the kubelet looks for iptables once, at start
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "IPv4" not in INITIALIZED.findall(kubelet.log):
        time.sleep(0.5)
    assert "IPv4" in INITIALIZED.findall(kubelet.log), (
        "the kubelet never said it initialized its iptables rules:\n" + kubelet.log[-3000:]
    )
    after = host_state()
    assert before == after, f"the kubelet changed the host's network:\n{diff(before, after)}"
    inside = tables(("nsenter", "-t", str(kubelet.pid), "-n"))
    assert "-A KUBE-FIREWALL" in inside["iptables-save"] and " -j DROP" in inside["iptables-save"]
    assert ":KUBE-IPTABLES-HINT" in inside["iptables-save"], inside["iptables-save"]
