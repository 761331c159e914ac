"""Start a real etcd and kube-apiserver on 127.0.0.1 for the interop tests.

:func:`start_kube_apiserver` generates a CA, a serving certificate and a service-account
signing key with the ``openssl`` command, writes a static token file (an admin token in
``system:masters`` plus any extra users asked for), starts etcd and kube-apiserver on free
loopback ports with ``--authorization-mode=Node,RBAC`` and the requested feature gates,
waits for ``/readyz`` and writes a kubeconfig. The returned :class:`KubeApiServer` knows
its URL, CA, tokens and kubeconfig, makes official ``kubernetes`` client objects, and can
mint service-account tokens through the TokenRequest API. :meth:`KubeApiServer.stop`
tears everything down.

Nothing here needs a kubelet or a controller manager: pods stay where the tests put them.
Because no controller manager creates the ``default`` service account of new namespaces,
the ``ServiceAccount`` admission plugin is disabled unless a test asks for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: Feature gates used when a test does not ask for others.
DEFAULT_FEATURE_GATES: Mapping[str, bool] = {"ResourceHealthStatus": True}

ADMIN_USER = "interop-admin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def openssl_unavailable_reason() -> str | None:
    if shutil.which("openssl") is None:
        return "the openssl command is needed to make the API server's certificates"
    return None


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        ["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()}")


def make_certificates(directory: Path) -> dict[str, Path]:
    """CA, serving certificate for 127.0.0.1/localhost, service-account key pair."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "ca.key",
        cwd=directory,
    )
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        "ca.key",
        "-sha256",
        "-days",
        "30",
        "-subj",
        "/CN=kubelet-dra-interop-ca",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    _openssl(
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        "serving.key",
        cwd=directory,
    )
    _openssl(
        "req",
        "-new",
        "-key",
        "serving.key",
        "-subj",
        "/CN=kube-apiserver",
        "-out",
        "serving.csr",
        cwd=directory,
    )
    (directory / "serving.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n"
        "extendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n"
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "serving.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "30",
        "-sha256",
        "-extfile",
        "serving.ext",
        "-out",
        "serving.crt",
        cwd=directory,
    )
    _openssl(
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        "sa.key",
        cwd=directory,
    )
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    return {
        name: directory / name
        for name in ("ca.crt", "serving.crt", "serving.key", "sa.key", "sa.pub")
    }


def format_feature_gates(gates: Mapping[str, bool]) -> str:
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


@dataclasses.dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, limit: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def _spawn(name: str, cmd: Sequence[str], log: Path) -> _Proc:
    with log.open("ab") as out:
        popen = subprocess.Popen(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
    return _Proc(name, popen, log)


@dataclasses.dataclass
class KubeApiServer:
    """A running etcd + kube-apiserver pair."""

    url: str
    ca_file: Path
    admin_token: str
    kubeconfig: Path
    feature_gates: dict[str, bool]
    workdir: Path
    #: Static-token users: user name -> bearer token.
    tokens: dict[str, str]
    etcd_url: str
    _procs: list[_Proc] = dataclasses.field(default_factory=list, repr=False)

    # -- clients ---------------------------------------------------------------------------

    def client_configuration(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.Configuration`` for this server (admin token by default)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.ssl_ca_cert = str(self.ca_file)
        cfg.verify_ssl = True
        cfg.api_key = {"authorization": token or self.admin_token}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        return cfg

    def api_client(self, token: str | None = None) -> Any:
        """A ``kubernetes.client.ApiClient``; close it when done (or use ``with``)."""
        from kubernetes import client

        return client.ApiClient(self.client_configuration(token))

    def write_kubeconfig(self, path: Path, token: str, user: str = "user") -> Path:
        """Write a kubeconfig for a bearer token (JSON, which every YAML loader reads)."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "interop",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": "interop", "context": {"cluster": "interop", "user": user}}],
            "current-context": "interop",
        }
        path.write_text(json.dumps(config, indent=2) + "\n")
        path.chmod(0o600)
        return path

    def service_account_token(
        self, namespace: str, name: str, *, expiration_seconds: int = 3600
    ) -> str:
        """Create the namespace and service account if missing; return a TokenRequest token."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        with self.api_client() as api:
            core = client.CoreV1Api(api)
            for create in (
                lambda: core.create_namespace(
                    client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
                ),
                lambda: core.create_namespaced_service_account(
                    namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name))
                ),
            ):
                try:
                    create()
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds)
            )
            result = core.create_namespaced_service_account_token(name, namespace, request)
            if result.status is None or not result.status.token:
                raise RuntimeError(f"TokenRequest for {namespace}/{name} returned no token")
            return str(result.status.token)

    # -- lifecycle -------------------------------------------------------------------------

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ---\n{p.tail()}" for p in self._procs)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            proc.stop()
        self._procs.clear()


def _wait_ready(
    url: str, ca_file: Path, token: str, procs: Sequence[_Proc], timeout: float
) -> None:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        for proc in procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited during start-up:\n{proc.tail()}")
        request = urllib.request.Request(
            f"{url}/readyz", headers={"Authorization": f"Bearer {token}"}
        )
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=5) as resp:
                if resp.status == 200:
                    return
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
        except (OSError, ssl.SSLError) as exc:
            last = str(exc)
        time.sleep(0.25)
    raise TimeoutError(f"kube-apiserver not ready within {timeout}s ({last})")


def _wait_etcd(url: str, proc: _Proc, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"etcd exited during start-up:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if b"true" in resp.read():
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"etcd not healthy within {timeout}s:\n{proc.tail()}")


def start_kube_apiserver(
    *,
    etcd_bin: Path,
    apiserver_bin: Path,
    workdir: Path,
    feature_gates: Mapping[str, bool] = DEFAULT_FEATURE_GATES,
    runtime_config: str | None = None,
    extra_users: Mapping[str, Sequence[str]] | None = None,
    disable_admission_plugins: Sequence[str] = ("ServiceAccount",),
    extra_args: Sequence[str] = (),
    timeout: float = 90.0,
) -> KubeApiServer:
    """Start etcd and kube-apiserver in ``workdir``; see the module docstring.

    ``extra_users`` maps static-token user names to their groups; their tokens end up in
    :attr:`KubeApiServer.tokens`. Without RBAC bindings such users can do nothing.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    certs = make_certificates(workdir / "pki")
    tokens = {ADMIN_USER: secrets.token_hex(16)}
    groups: dict[str, Sequence[str]] = {ADMIN_USER: ("system:masters",)}
    for user, user_groups in (extra_users or {}).items():
        tokens[user] = secrets.token_hex(16)
        groups[user] = tuple(user_groups)
    token_file = workdir / "tokens.csv"
    lines = []
    for user, token in tokens.items():
        group_field = ",".join(groups[user])
        lines.append(f'{token},{user},uid-{user},"{group_field}"')
    token_file.write_text("\n".join(lines) + "\n")
    token_file.chmod(0o600)

    procs: list[_Proc] = []
    try:
        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = _spawn(
            "etcd",
            [
                str(etcd_bin),
                "--name=interop",
                f"--data-dir={workdir / 'etcd-data'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=interop={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
            workdir / "etcd.log",
        )
        procs.append(etcd)
        _wait_etcd(etcd_url, etcd, timeout=30)

        secure_port = free_port()
        url = f"https://127.0.0.1:{secure_port}"
        args = [
            str(apiserver_bin),
            f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--secure-port={secure_port}",
            f"--cert-dir={workdir / 'cert-dir'}",
            f"--tls-cert-file={certs['serving.crt']}",
            f"--tls-private-key-file={certs['serving.key']}",
            f"--token-auth-file={token_file}",
            "--authorization-mode=Node,RBAC",
            "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={certs['sa.pub']}",
            f"--service-account-signing-key-file={certs['sa.key']}",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false",
            "--profiling=false",
            "--v=1",
        ]
        if feature_gates:
            args.append(f"--feature-gates={format_feature_gates(feature_gates)}")
        if runtime_config:
            args.append(f"--runtime-config={runtime_config}")
        if disable_admission_plugins:
            args.append(f"--disable-admission-plugins={','.join(disable_admission_plugins)}")
        args.extend(extra_args)
        apiserver = _spawn("kube-apiserver", args, workdir / "kube-apiserver.log")
        procs.append(apiserver)
        _wait_ready(url, certs["ca.crt"], tokens[ADMIN_USER], procs, timeout)
    except BaseException:
        for proc in reversed(procs):
            with contextlib.suppress(Exception):
                proc.stop()
        raise

    server = KubeApiServer(
        url=url,
        ca_file=certs["ca.crt"],
        admin_token=tokens[ADMIN_USER],
        kubeconfig=workdir / "admin.kubeconfig",
        feature_gates=dict(feature_gates),
        workdir=workdir,
        tokens=tokens,
        etcd_url=etcd_url,
        _procs=procs,
    )
    server.write_kubeconfig(server.kubeconfig, server.admin_token, ADMIN_USER)
    return server
