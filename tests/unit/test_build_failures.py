"""Which ``go`` failures leave a tier unavailable (skip) and which fail the build
(tests/interop/_build.py ``is_network_error``): the network's fault or ours."""

from __future__ import annotations

import pytest

from tests.interop import _build

NETWORK = [
    'go: k8s.io/api@v0.37.2: Get "https://proxy.golang.org/k8s.io/api/@v/v0.37.2.mod": '
    "dial tcp: lookup proxy.golang.org: no such host",
    "go: downloading go1.27.3: Get ...: dial tcp 10.0.0.1:443: connect: connection refused",
    "reading https://proxy.example/sigs.k8s.io/iptables-wrappers/@v/list: 403 Forbidden",
    "go: github.com/x/y@v1.0.0: reading ...: 502 Bad Gateway",
    "net/http: TLS handshake timeout",
    # kubelet 1.38 imports a module the proxy refuses, so no go.sum can list it.
    "kubelet_network_linux.go:26:2: missing go.sum entry for module providing package "
    "sigs.k8s.io/iptables-wrappers/pkg/iptables (imported by k8s.io/kubernetes/pkg/kubelet)",
]
OURS = [
    "verifying k8s.io/api@v0.37.2: checksum mismatch\n\tdownloaded: h1:abc\n\tgo.sum: h1:abd\n"
    "SECURITY ERROR\nThis download does NOT match an earlier download recorded in go.sum.",
    "missing go.sum entry for module providing package k8s.io/kubelet/pkg/apis",
    "go: k8s.io/kubernetes@v1.37.99: invalid version: unknown revision v1.37.99",
    "go: go.mod requires go >= 1.27.0 (running go 1.26.8; GOTOOLCHAIN=local)",
    "main.go:3:8: package kubelet-dra/x is not in std",
    # A checksum mismatch is ours even where the output also names a proxy answer.
    "verifying x@v1: checksum mismatch; reading https://proxy/x/@v/v1.zip: 502 Bad Gateway",
]


@pytest.mark.parametrize("stderr", NETWORK)
def test_the_network_or_the_proxy_leaves_the_build_unavailable(stderr: str) -> None:
    assert _build.is_network_error(stderr)


@pytest.mark.parametrize("stderr", OURS)
def test_a_broken_go_sum_pin_or_toolchain_fails_the_build(stderr: str) -> None:
    assert not _build.is_network_error(stderr)
