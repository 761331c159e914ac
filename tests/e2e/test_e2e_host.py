"""The host left unchanged: the kubelet's iptables rules stay in its own network namespace.

Wherever an ``iptables`` command exists, the kubelet's ``initNetworkUtil``
(``pkg/kubelet/kubelet_network_linux.go``) makes chains in the tables of the network it runs
in: ``KUBE-IPTABLES-HINT`` (mangle), ``KUBE-FIREWALL`` with a DROP rule for packets to
127.0.0.0/8 from elsewhere, jumped to from INPUT and OUTPUT (filter), and the
``KUBE-KUBELET-CANARY`` chains it watches. The e2e kubelet runs in a network namespace of
its own (``_node.py``). With this test selected, the session gets Debian's ``iptables``
first and reads the host's ``iptables-save``, ``ip6tables-save`` and addresses before its
first kubelet starts (``_host.py``). The test restarts the kubelet, waits until it says that
it initialized its rules, and compares the host with that reading: every kubelet of the
session so far, this one included, left it as it was. It also reads the kubelet's own
namespace, where the chains must be: a comparison the kubelet had no reason to break would
prove nothing.
"""

from __future__ import annotations

import re
import time

from tests.e2e import _host

#: What the kubelet's log says once per family after initNetworkUtil made its chains.
INITIALIZED = re.compile(r'Initialized iptables rules\.?"? protocol="?(IPv4|IPv6)')


def test_kubelet_leaves_the_hosts_iptables_unchanged(host_network, line, kubelet_on):
    assert host_network is not None, "conftest.py read no host state before the first kubelet"
    kubelet = kubelet_on(line, True)
    offset = kubelet.log_path.stat().st_size
    kubelet.restart()  # a kubelet started in this test, with iptables there to run

    def initialized() -> list[str]:
        with kubelet.log_path.open("rb") as log:
            log.seek(offset)  # this start's lines only
            return INITIALIZED.findall(log.read().decode(errors="replace"))

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "IPv4" not in initialized():
        time.sleep(0.5)
    assert "IPv4" in initialized(), (
        "the kubelet never said it initialized its iptables rules:\n" + kubelet.log[-3000:]
    )
    after = _host.state()
    assert host_network == after, (
        f"a kubelet changed the host's network:\n{_host.diff(host_network, after)}"
    )
    inside = _host.tables(("nsenter", "-t", str(kubelet.pid), "-n"))["iptables-save"]
    assert "-A KUBE-FIREWALL" in inside and " -j DROP" in inside, inside
    assert ":KUBE-IPTABLES-HINT" in inside, inside
