"""``kube.load_client``: the one way the sidecar and the manager get API credentials.

Order: an explicit kubeconfig, else the in-cluster service account, else
``~/.kube/config``; each unusable case is one ``ConfigError`` line. The
clients are used against the API stand-in, so a wrong server would fail.
"""

from __future__ import annotations

import pathlib

import kubernetes.client
import pytest

from kubelet_dra import errors, kube
from kubelet_dra.testing import FakeApiServer, make_pod


@pytest.fixture
def not_in_cluster(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> pathlib.Path:
    """No service-account environment; ``$HOME`` is an empty directory (returned)."""
    for name in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def _pod_names(client: kubernetes.client.ApiClient) -> list[str]:
    pods = kubernetes.client.CoreV1Api(client).list_namespaced_pod("default")
    return [str(pod.metadata.name) for pod in pods.items if pod.metadata is not None]


def test_explicit_kubeconfig_reaches_its_server_without_urllib3_retries(
    not_in_cluster: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    with FakeApiServer() as api:
        api.create_pod(make_pod("train"))
        client = kube.load_client(api.write_kubeconfig(tmp_path / "config"))
        assert _pod_names(client) == ["train"]
        assert client.configuration.retries == 0


def test_without_a_cluster_the_home_kubeconfig_is_used(not_in_cluster: pathlib.Path) -> None:
    (not_in_cluster / ".kube").mkdir()
    with FakeApiServer() as api:
        api.create_pod(make_pod("from-home"))
        api.write_kubeconfig(not_in_cluster / ".kube" / "config")
        assert _pod_names(kube.load_client(None)) == ["from-home"]


def test_without_a_cluster_or_a_home_kubeconfig_it_says_so(not_in_cluster: pathlib.Path) -> None:
    with pytest.raises(errors.ConfigError, match=r"not in a cluster and ~/\.kube/config does not"):
        kube.load_client(None)


def test_a_kubeconfig_without_a_usable_context_is_one_line(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "config"
    path.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(errors.ConfigError) as raised:
        kube.load_client(path)
    message = str(raised.value)
    assert message.startswith("cannot load Kubernetes credentials: ")
    assert "current-context" in message and str(path) in message and "\n" not in message
