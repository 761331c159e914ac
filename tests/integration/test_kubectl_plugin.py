"""``kubectl dra-health`` against the FakeApiServer, through the official client.

Every test runs the real command (``kubelet_dra.kubectl.main``, or the installed console
script as a process) against a real HTTP server and checks its output, its exit status and
the requests it sent: only GETs, pods in pages, claims only as needed.
"""

from __future__ import annotations

import ctypes
import errno
import io
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import kubernetes.client
import pytest
import yaml

from kubelet_dra.kubectl import _api, _cli, main
from kubelet_dra.kubectl import _config as config
from kubelet_dra.status import claims
from kubelet_dra.testing import FakeApiServer, make_claim, make_pod
from kubelet_dra.testing.fakeapi import Container, PodClaim

from ._kubectl_scenario import (
    DRIVER,
    NODE,
    XID,
    condition,
    demo_scenario,
    resource,
    rid,
    with_health,
)

TAINT_KIND = "DeviceTaintRule"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def demo(api: FakeApiServer, tmp_path: pathlib.Path) -> str:
    """The demo's cluster; returns a kubeconfig path."""
    demo_scenario(api)
    api.reset_log()
    return str(api.write_kubeconfig(tmp_path / "kubeconfig"))


def run(kubeconfig: str, *args: str) -> tuple[int, str]:
    out = io.StringIO()
    code = main(["--kubeconfig", kubeconfig, *args], out=out)
    return code, out.getvalue()


def rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()[1:]]


def squeeze(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.splitlines())


def assert_read_only(api: FakeApiServer) -> None:
    assert api.requests, "the command sent no request"
    assert {r.method for r in api.requests} == {"GET"}


# -- devices -----------------------------------------------------------------------------------


def test_devices_shows_the_unhealthy_and_unknown_devices_resolved_through_claims(
    api: FakeApiServer, demo: str
) -> None:
    code, text = run(demo, "devices")
    assert code == 0
    header = text.splitlines()[0].split("   ")
    assert [h.strip() for h in header if h.strip()] == [
        "NODE",
        "DRIVER",
        "POOL",
        "DEVICE",
        "RESOURCE ID",
        "HEALTH",
        "MESSAGE",
        "PODS",
    ]
    lines = text.splitlines()[1:]
    assert len(lines) == 2
    assert lines[0].split()[:6] == [NODE, DRIVER, NODE, "gpu-1", rid("gpu-1"), "Unhealthy"]
    assert XID in lines[0] and lines[0].endswith("default/train-1,default/train-2")
    assert lines[1].split() == [
        NODE,
        DRIVER,
        NODE,
        "gpu-3",
        rid("gpu-3"),
        "Unknown",
        "<none>",
        "default/train-0",
    ]
    assert_read_only(api)
    # Pods across namespaces in pages; only the claims of shown devices, once each.
    pod_lists = [r for r in api.requests if r.path == "/api/v1/pods"]
    assert pod_lists and all(r.query.get("limit") == "500" for r in pod_lists)
    claim_gets = sorted(
        r.path.rsplit("/", 1)[1] for r in api.requests if "resourceclaims" in r.path
    )
    assert claim_gets == ["train-0-gpus", "train-1-gpus", "train-2-gpus"]
    assert not any("devicetaintrules" in r.path for r in api.requests), "table needs no taints"


def test_devices_all_and_health_select_what_is_shown(demo: str) -> None:
    code, text = run(demo, "devices", "--all")
    assert code == 0
    assert [r[3] for r in rows(text)] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    assert rows(text)[0][5] == "Healthy" and rows(text)[0][-1] == "default/train-0,default/train-1"
    code, text = run(demo, "devices", "--health", "healthy")
    assert [r[3] for r in rows(text)] == ["gpu-0", "gpu-2"]
    code, text = run(demo, "devices", "--health", "Unknown")
    assert [r[3] for r in rows(text)] == ["gpu-3"]


def test_devices_health_and_all_exclude_each_other(demo: str) -> None:
    with pytest.raises(SystemExit) as exc:
        run(demo, "devices", "--all", "--health", "Unknown")
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        run(demo, "devices", "--health", "Broken")


def test_fail_on_exits_3_for_any_matching_device_in_scope(demo: str) -> None:
    assert run(demo, "devices", "--fail-on", "Unhealthy")[0] == 3
    assert run(demo, "devices", "--fail-on", "Unknown")[0] == 3
    # Independent of what is shown: only Unknown shown, yet gpu-1 is Unhealthy.
    code, text = run(demo, "devices", "--health", "Unknown", "--fail-on", "Unhealthy")
    assert code == 3 and [r[3] for r in rows(text)] == ["gpu-3"]
    assert run(demo, "devices", "--driver", "other.example.com", "--fail-on", "Unhealthy")[0] == 0
    assert run(demo, "pods", "--fail-on", "Unhealthy,Unknown")[0] == 3
    assert run(demo, "describe", "pod", "train-2", "--fail-on", "Unhealthy")[0] == 3
    assert run(demo, "describe", "pod", "train-0", "--fail-on", "Unhealthy")[0] == 0


def test_node_is_a_field_selector_and_driver_filters(api: FakeApiServer, demo: str) -> None:
    other = make_pod("far", "node-2", claims=["far-gpu"])
    api.create_claim(
        make_claim("far-gpu", results=[("fpga.example.com", "node-2", "f0", "fpga")], node="node-2")
    )
    api.create_pod(
        with_health(
            other,
            [
                {
                    "name": "claim:far-gpu",
                    "resources": [resource("fpga.example.com/node-2/f0", "Unhealthy")],
                }
            ],
        )
    )
    api.reset_log()
    code, text = run(demo, "devices", "--node", "node-2")
    assert code == 0
    assert [r[:4] for r in rows(text)] == [["node-2", "fpga.example.com", "node-2", "f0"]]
    running = "status.phase!=Succeeded,status.phase!=Failed"
    assert all(
        r.query.get("fieldSelector") == f"spec.nodeName=node-2,{running}"
        for r in api.requests
        if r.path == "/api/v1/pods"
    )
    code, text = run(demo, "devices", "--driver", DRIVER)
    assert code == 0 and {r[1] for r in rows(text)} == {DRIVER}
    code, text = run(demo, "pods", "-A", "--driver", "fpga.example.com")
    assert code == 0 and [r[1] for r in rows(text)] == ["far"]


def test_devices_leave_out_terminated_pods_which_pods_still_shows(
    api: FakeApiServer, demo: str
) -> None:
    # A Job's pod failed on gpu-2 (its post-mortem status says Unhealthy); gpu-2 went back to
    # the pool and train-2 reports it Healthy now.
    api.create_claim(make_claim("job-gpu", results=[(DRIVER, NODE, "gpu-2", "gpus")], node=NODE))
    failed = make_pod("job-x", NODE, claims=["job-gpu"], phase="Failed")
    entry = {"name": "claim:job-gpu", "resources": [resource(rid("gpu-2"), "Unhealthy", XID)]}
    api.create_pod(with_health(failed, [entry]))
    code, text = run(demo, "devices", "--all")
    assert code == 0 and next(r for r in rows(text) if r[3] == "gpu-2")[5] == "Healthy"
    assert "job-x" not in text
    code, text = run(demo, "pods", "--health", "Unhealthy")
    assert "job-x" in text


def test_json_is_the_documented_schema(demo: str) -> None:
    code, text = run(demo, "devices", "-o", "json")
    assert code == 0
    doc = json.loads(text)
    assert doc["apiVersion"] == "kubelet-dra.io/v1alpha1" and doc["kind"] == "DeviceHealthList"
    first = doc["items"][0]
    assert first == {
        "node": NODE,
        "driver": DRIVER,
        "pool": NODE,
        "device": "gpu-1",
        "resourceID": rid("gpu-1"),
        "health": "Unhealthy",
        "message": XID,
        "pods": [
            {
                "namespace": "default",
                "name": "train-1",
                "container": "main",
                "claim": "train-1-gpus",
            },
            {
                "namespace": "default",
                "name": "train-2",
                "container": "main",
                "claim": "train-2-gpus",
            },
        ],
        "taints": [],
    }
    code, text = run(demo, "pods", "-o", "yaml")
    doc = yaml.safe_load(text)
    assert doc["kind"] == "PodDeviceHealthList" and doc["apiVersion"] == "kubelet-dra.io/v1alpha1"
    assert doc["items"][0] == {
        "namespace": "default",
        "name": "train-0",
        "node": NODE,
        "container": "main",
        "claim": "claim:train-0-gpus",
        "resourceID": rid("gpu-3"),
        "health": "Unknown",
        "message": "",
        "condition": {"status": "Unknown", "reason": "DeviceHealthUnknown"},
    }


def test_cdi_ids_resolve_when_the_claim_says_which_device_else_null(
    api: FakeApiServer, tmp_path: pathlib.Path
) -> None:
    # One device: the CDI ID is that device. Two devices: the CDI name ends with the device
    # name. Two devices and an opaque CDI name: unresolved.
    cases = {
        "one": ([("d.example.com", "p", "dev-a", "r")], "d.example.com/class=uid1-dev-a"),
        "two": (
            [("d.example.com", "p", "dev-a", "r"), ("d.example.com", "p", "dev-b", "r")],
            "d.example.com/class=uid2-dev-b",
        ),
        "opaque": (
            [("d.example.com", "p", "dev-a", "r"), ("d.example.com", "p", "dev-b", "r")],
            "d.example.com/class=x7",
        ),
    }
    for name, (results, cdi) in cases.items():
        api.create_claim(make_claim(name, results=results))
        api.create_pod(
            with_health(
                make_pod(f"pod-{name}", claims=[name]),
                [{"name": f"claim:{name}", "resources": [resource(cdi, "Unhealthy")]}],
            )
        )
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kc"))
    _, text = run(kubeconfig, "devices", "-o", "json")
    found = {
        i["resourceID"]: (i["driver"], i["pool"], i["device"]) for i in json.loads(text)["items"]
    }
    assert found == {
        "d.example.com/class=uid1-dev-a": ("d.example.com", "p", "dev-a"),
        "d.example.com/class=uid2-dev-b": ("d.example.com", "p", "dev-b"),
        "d.example.com/class=x7": (None, None, None),
    }
    _, text = run(kubeconfig, "devices")
    assert ["node-1", "<none>", "<none>", "<none>", "d.example.com/class=x7"] in [
        r[:5] for r in rows(text)
    ]


def test_missing_claim_leaves_the_device_unresolved(
    api: FakeApiServer, tmp_path: pathlib.Path
) -> None:
    api.create_pod(
        with_health(
            make_pod("orphan", claims=["gone"]),
            [{"name": "claim:gone", "resources": [resource(rid("gpu-9"), "Unhealthy")]}],
        )
    )
    kubeconfig = str(api.write_kubeconfig(tmp_path / "kc"))
    code, text = run(kubeconfig, "devices", "-o", "json")
    item = json.loads(text)["items"][0]
    assert code == 0 and item["driver"] is None and item["pods"][0]["claim"] == "gone"


# -- taints ------------------------------------------------------------------------------------


def taint_rule(
    name: str, selector: dict[str, str] | None, key: str, effect: str, value: str | None = None
) -> dict[str, object]:
    spec: dict[str, object] = {
        "taint": {"key": key, "effect": effect, **({"value": value} if value else {})}
    }
    if selector is not None:
        spec["deviceSelector"] = selector
    return {"metadata": {"name": name}, "spec": spec}


def test_wide_and_json_show_taints_from_device_taint_rules(api: FakeApiServer, demo: str) -> None:
    for rule in (
        taint_rule(
            "gpu-1-xid",
            {"driver": DRIVER, "pool": NODE, "device": "gpu-1"},
            "gpu.example.com/xid",
            "NoSchedule",
            "48",
        ),
        taint_rule("whole-pool", {"pool": NODE}, "maintenance", "None"),
        taint_rule("other-driver", {"driver": "fpga.example.com"}, "x", "NoExecute"),
        taint_rule("no-selector", None, "y", "NoExecute"),
    ):
        api.create_object("resource.k8s.io/v1", "devicetaintrules", rule)
    code, text = run(demo, "devices", "-o", "wide")
    assert code == 0
    assert "TAINTS" in text.splitlines()[0] and "CLAIMS" in text.splitlines()[0]
    gpu1 = next(r for r in rows(text) if r[3] == "gpu-1")
    assert gpu1[-2:] == [
        "gpu.example.com/xid=48:NoSchedule,maintenance:None",
        "default/train-1-gpus,default/train-2-gpus",
    ]
    _, text = run(demo, "devices", "-o", "json")
    taints = {i["device"]: i["taints"] for i in json.loads(text)["items"]}
    assert taints["gpu-3"] == [
        {"key": "maintenance", "value": None, "effect": "None", "rule": "whole-pool"}
    ]
    # v1 answered, so no older version was asked.
    assert {r.path for r in api.requests if "devicetaintrules" in r.path} == {
        "/apis/resource.k8s.io/v1/devicetaintrules"
    }
    assert_read_only(api)


def test_taints_fall_back_to_older_versions_and_absence_is_not_an_error(
    api: FakeApiServer, demo: str
) -> None:
    api.device_taint_versions = ()  # a server that serves no version of DeviceTaintRules
    code, text = run(demo, "devices", "-o", "json")
    assert code == 0 and all(i["taints"] == [] for i in json.loads(text)["items"])
    # Discovery (kube.taintrules, the bridge's too) asked each version; no list was sent.
    assert not any("devicetaintrules" in r.path for r in api.requests)
    assert {f"/apis/resource.k8s.io/{v}" for v in ("v1", "v1beta2", "v1alpha3")} <= {
        r.path.rstrip("/") for r in api.requests
    }
    api.serve_resource("resource.k8s.io/v1alpha3", "devicetaintrules", TAINT_KIND)
    api.create_object(
        "resource.k8s.io/v1alpha3",
        "devicetaintrules",
        taint_rule("a3", {"device": "gpu-3"}, "k", "NoSchedule"),
    )
    # v1alpha3's CEL selectors cannot be evaluated here: such a rule is not shown.
    api.create_object(
        "resource.k8s.io/v1alpha3",
        "devicetaintrules",
        {
            **taint_rule("cel", {"device": "gpu-3"}, "cel", "NoSchedule"),
            "spec": {
                "deviceSelector": {
                    "device": "gpu-3",
                    "selectors": [{"cel": {"expression": "true"}}],
                },
                "taint": {"key": "cel", "effect": "NoSchedule"},
            },
        },
    )
    _, text = run(demo, "devices", "-o", "json")
    taints = {i["device"]: [t["rule"] for t in i["taints"]] for i in json.loads(text)["items"]}
    assert taints == {"gpu-1": [], "gpu-3": ["a3"]}
    api.serve_resource("resource.k8s.io/v1", "devicetaintrules", TAINT_KIND)
    api.fail("GET", r"/apis/resource.k8s.io/v1/devicetaintrules", code=403, times=None)
    code, text = run(demo, "devices", "-o", "wide")
    assert code == 0 and rows(text)[0][-2] == "<none>"


# -- pods and describe -------------------------------------------------------------------------


def test_pods_lists_each_container_claim_and_resource_with_the_condition(
    api: FakeApiServer, demo: str
) -> None:
    code, text = run(demo, "pods")
    assert code == 0
    assert text.splitlines()[0].split() == [
        "NAMESPACE",
        "POD",
        "CONTAINER",
        "CLAIM",
        "RESOURCE",
        "ID",
        "HEALTH",
        "MESSAGE",
        "CONDITION",
    ]
    got = [(r[1], r[3], r[4], r[5], r[-1]) for r in rows(text)]
    assert got == [
        ("train-0", "claim:train-0-gpus", rid("gpu-3"), "Unknown", "Unknown/DeviceHealthUnknown"),
        ("train-1", "claim:train-1-gpus", rid("gpu-1"), "Unhealthy", "False/DeviceUnhealthy"),
        ("train-2", "claim:train-2-gpus", rid("gpu-1"), "Unhealthy", "False/DeviceUnhealthy"),
    ]
    # `pods` needs no claim (no --driver) and lists the context's namespace by default.
    assert {r.path for r in api.requests} == {"/api/v1/namespaces/default/pods"}
    code, text = run(demo, "pods", "-n", "elsewhere")
    assert code == 0 and text == ""
    code, text = run(demo, "pods", "-A", "--all", "-o", "wide")
    assert len(rows(text)) == 6 and all(r[-1] == NODE for r in rows(text))


def test_condition_type_comes_from_settings(
    api: FakeApiServer, demo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBELET_DRA_POD_CONDITION_TYPE", "example.com/GPUHealthy")
    monkeypatch.setenv("KUBELET_DRA_HEALTH_TIMEOUT", "-1")  # the sidecar's problem, not ours
    _, text = run(demo, "pods", "-o", "json")
    assert all(i["condition"] is None for i in json.loads(text)["items"])
    _, text = run(demo, "pods", "-o", "json", "--condition-type", "DeviceHealthy")
    assert all(i["condition"] for i in json.loads(text)["items"])


def test_describe_pod_shows_health_per_container_claim_and_resource(
    api: FakeApiServer, tmp_path: pathlib.Path
) -> None:
    claim = make_claim(
        "shared", results=[(DRIVER, NODE, "gpu-0", "a"), (DRIVER, NODE, "gpu-1", "b")]
    )
    api.create_claim(claim)
    pod = make_pod(
        "p",
        NODE,
        claims=[PodClaim("gpus", claim_name="shared"), "never-reported"],
        containers=[
            Container("main", claims=[("gpus", "a")]),
            Container("side", claims=[("gpus", "b"), "never-reported"]),
        ],
    )
    pod = with_health(
        pod, [{"name": "claim:gpus/a", "resources": [resource(rid("gpu-0"), "Healthy")]}]
    )
    pod = with_health(
        pod,
        [{"name": "claim:gpus/b", "resources": [resource(rid("gpu-1"), "Unhealthy", XID)]}],
        container="side",
        condition=condition(
            "False", "DeviceUnhealthy", "Unhealthy devices: gpu-1", since="2026-12-01T08:00:00Z"
        ),
    )
    created = api.create_pod(pod)
    involved = {
        "kind": "Pod",
        "name": "p",
        "namespace": "default",
        "uid": created["metadata"]["uid"],
    }
    with api.api_client() as client:
        core = kubernetes.client.CoreV1Api(client)
        for name, reason in (
            ("e1", "DeviceUnhealthy"),
            ("e2", "Scheduled"),
            ("e3", "DeviceHealthy"),
        ):
            core.create_namespaced_event(
                "default",
                {
                    "metadata": {"name": name},
                    "involvedObject": involved,
                    "reason": reason,
                    "message": f"{reason} message",
                    "type": "Warning",
                    "count": 2,
                    "lastTimestamp": "2026-12-01T08:00:0" + name[-1] + "Z",
                    "source": {"component": "kubelet-dra-health"},
                },
            )
    api.reset_log()
    code, text = run(str(api.write_kubeconfig(tmp_path / "kc")), "describe", "pod", "p")
    assert code == 0
    assert "Condition:    DeviceHealthy=False (DeviceUnhealthy), since 2026-12-01T08:00:00Z" in text
    assert "Unhealthy devices: gpu-1" in text
    main_part, side_part = text.split("Container side:")
    assert "claim:gpus/a (ResourceClaim shared):" in main_part
    assert f"{rid('gpu-0')} Healthy {DRIVER}/{NODE}/gpu-0 <none>" in squeeze(main_part)
    assert "claim:gpus/b (ResourceClaim shared):" in side_part
    assert f"{rid('gpu-1')} Unhealthy {DRIVER}/{NODE}/gpu-1 {XID}" in squeeze(side_part)
    assert (
        "claim:never-reported (ResourceClaim never-reported):\n      <no health reported>"
        in side_part
    )
    events = text.split("Events:")[1]
    assert "DeviceUnhealthy" in events and "DeviceHealthy" in events and "Scheduled" not in events
    assert events.index("DeviceUnhealthy") < events.index("DeviceHealthy  "), "oldest first"
    assert_read_only(api)
    event_lists = [r for r in api.requests if r.path.endswith("/events")]
    assert event_lists[0].query["fieldSelector"] == "involvedObject.kind=Pod,involvedObject.name=p"


def test_describe_of_a_missing_pod_is_a_one_line_error(
    demo: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = run(demo, "describe", "pod", "nope")
    err = capsys.readouterr().err
    assert code == 1 and err == 'error: pod "nope" not found in namespace "default"\n'


# -- reading efficiently -----------------------------------------------------------------------


def test_pods_are_listed_in_pages_and_claims_read_once(api: FakeApiServer) -> None:
    api.create_claim(make_claim("shared", results=[(DRIVER, NODE, "gpu-0", "gpus")]))
    for i in range(5):
        pod = make_pod(f"p{i}", NODE, claims=["shared"])
        api.create_pod(
            with_health(
                pod, [{"name": "claim:shared", "resources": [resource(rid("gpu-0"), "Unhealthy")]}]
            )
        )
    api.reset_log()
    with api.api_client() as client:
        reader = _api.Reader(client, page_size=2)
        view = _cli.View(reader, _cli._scope(_cli.parse(["devices"]), "default"), "devices")
        view.load()
        text, _ = view.render()
    lists = [r for r in api.requests if r.path == "/api/v1/pods"]
    assert [r.query.get("limit") for r in lists] == ["2", "2", "2"]
    assert "continue" not in lists[0].query and all(r.query.get("continue") for r in lists[1:])
    assert sum(1 for r in api.requests if "resourceclaims" in r.path) == 1
    assert text.splitlines()[1].endswith("   default/p0,default/p1,default/p2 +2 more")


def test_many_claims_are_read_with_one_paged_list(api: FakeApiServer) -> None:
    for i in range(4):
        api.create_claim(make_claim(f"c{i}", results=[(DRIVER, NODE, f"gpu-{i}", "gpus")]))
        pod = make_pod(f"p{i}", NODE, claims=[f"c{i}"])
        api.create_pod(
            with_health(
                pod,
                [
                    {
                        "name": f"claim:c{i}",
                        "resources": [resource(f"{DRIVER}/class=x-gpu-{i}", "Unhealthy")],
                    }
                ],
            )
        )
    api.reset_log()
    with api.api_client() as client:
        reader = _api.Reader(client, page_size=3)
        with _api.ClaimFetcher(
            reader, None, lambda c: c["metadata"]["name"], get_limit=2
        ) as fetcher:
            fetcher.want(claims.ClaimKey("default", f"c{i}") for i in range(4))
            fetcher.want([claims.ClaimKey("default", "missing")])
            found = fetcher.results()
    assert found == {claims.ClaimKey("default", f"c{i}"): f"c{i}" for i in range(4)}
    claim_lists = [r for r in api.requests if r.path == "/apis/resource.k8s.io/v1/resourceclaims"]
    assert [r.query.get("limit") for r in claim_lists] == ["3", "3"]


# -- errors ------------------------------------------------------------------------------------


def test_unreachable_and_forbidden_api_are_one_line_errors(
    api: FakeApiServer, demo: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.fail("GET", r"/api/v1/pods$", code=403, times=1)
    assert run(demo, "devices")[0] == 1
    err = capsys.readouterr().err
    assert err.startswith("error: forbidden: ") and err.count("\n") == 1
    wrong = kubeconfig_file(
        tmp_path / "wrong", current="t", contexts={"t": ("default", "")}, server=api.url, token="x"
    )
    assert run(wrong, "devices")[0] == 1
    assert (
        capsys.readouterr().err
        == "error: the API server rejected our credentials (401 Unauthorized)\n"
    )
    url = api.url
    api.stop()
    assert run(demo, "pods")[0] == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: cannot reach the API server at {url}: ") and err.count("\n") == 1


# -- kubeconfig and in-cluster -----------------------------------------------------------------


def kubeconfig_file(
    path: pathlib.Path,
    *,
    current: str,
    contexts: dict[str, tuple[str, str]],
    server: str,
    token: str,
) -> str:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": current,
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": token}}],
                "contexts": [
                    {"name": n, "context": {"cluster": "c", "user": "u", "namespace": ns}}
                    for n, (ns, _) in contexts.items()
                ],
            }
        )
    )
    return str(path)


def test_kubeconfig_list_merges_as_kubectl(
    api: FakeApiServer, demo: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = kubeconfig_file(
        tmp_path / "a",
        current="team",
        contexts={"team": ("default", "")},
        server=api.url,
        token=str(api.token),
    )
    # The second file names the same cluster and user (ignored: the first wins them) and
    # its own current-context (ignored too; the Python client's merger would take it).
    second = kubeconfig_file(
        tmp_path / "b",
        current="prod",
        contexts={"prod": ("prod", ""), "team": ("x", "")},
        server="http://127.0.0.1:9",
        token="nope",
    )
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([first, str(tmp_path / "missing"), second]))
    out = io.StringIO()
    assert main(["pods"], out=out) == 0
    assert "train-1" in out.getvalue()
    conn = config.connect(None, "prod")
    assert conn.namespace == "prod" and conn.client.configuration.host == api.url
    conn.client.close()
    assert main(["pods", "--context", "prod"], out=io.StringIO()) == 0  # namespace prod: empty
    assert [r.path for r in api.requests][-1] == "/api/v1/namespaces/prod/pods"
    assert main(["pods", "--context", "nosuch"], out=io.StringIO()) == 1


def test_relative_paths_resolve_against_their_kubeconfig(tmp_path: pathlib.Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cfg").write_text(
        yaml.safe_dump(
            {
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": "https://x", "certificate-authority": "ca.crt"},
                    }
                ],
                "users": [
                    {
                        "name": "u",
                        "user": {"client-certificate": "/abs/cert", "client-key": "k.key"},
                    }
                ],
            }
        )
    )
    merged = config.merge_files([tmp_path / "sub" / "cfg"])
    assert merged["clusters"][0]["cluster"]["certificate-authority"] == str(
        tmp_path / "sub" / "ca.crt"
    )
    assert merged["users"][0]["user"] == {
        "client-certificate": "/abs/cert",
        "client-key": str(tmp_path / "sub" / "k.key"),
    }


def test_in_cluster_config_without_any_kubeconfig(tmp_path: pathlib.Path) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-token")
    (sa / "ca.crt").write_text("not used until a request")
    (sa / "namespace").write_text("gpu-ops\n")
    env = {
        "HOME": str(tmp_path),
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
    }
    conn = config.connect(None, None, environ=env, serviceaccount_dir=sa)
    assert conn.client.configuration.host == "https://10.96.0.1:443"
    assert conn.client.configuration.api_key["BearerToken"].endswith(" sa-token")
    assert conn.namespace == "gpu-ops" and conn.source == "in-cluster service account"
    conn.client.close()
    with pytest.raises(_api.ToolError, match="no configuration"):
        config.connect(None, None, environ={"HOME": str(tmp_path)}, serviceaccount_dir=sa)
    with pytest.raises(_api.ToolError, match="no such file"):
        config.connect(str(tmp_path / "nope"), None, environ=env, serviceaccount_dir=sa)


# -- watch -------------------------------------------------------------------------------------


class Output(io.StringIO):
    """What a watch printed so far, readable from the test's thread."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()

    def write(self, s: str) -> int:
        with self.lock:
            return super().write(s)

    def text(self) -> str:
        with self.lock:
            return self.getvalue()


def start_watch(kubeconfig: str, *args: str) -> tuple[threading.Thread, Output, list[int]]:
    out, codes = Output(), []
    thread = threading.Thread(
        target=lambda: codes.append(main(["--kubeconfig", kubeconfig, *args], out=out)), daemon=True
    )
    thread.start()
    return thread, out, codes


def make_gpu0_unhealthy(api: FakeApiServer, pod: str) -> None:
    current = api.get_pod("default", pod)
    status = current["status"]
    for entry in status["containerStatuses"][0]["allocatedResourcesStatus"]:
        for res in entry["resources"]:
            if res["resourceID"] == rid("gpu-0"):
                res["health"], res["message"] = "Unhealthy", "fell off the bus"
    api.set_pod_status("default", pod, status)


def test_watch_redraws_on_change_from_the_lists_resource_version(
    api: FakeApiServer, demo: str
) -> None:
    thread, out, codes = start_watch(
        demo,
        "devices",
        "-w",
        "--watch-max-redraws",
        "2",
        "--watch-seconds",
        "20",
        "--fail-on",
        "Unhealthy",
    )
    api.wait_for(lambda: any(r.is_watch for r in api.requests), timeout=10)
    list_rv = next(r for r in api.requests if r.path == "/api/v1/pods" and not r.is_watch)
    watch = next(r for r in api.requests if r.is_watch)
    assert watch.query["resourceVersion"] and watch.query["allowWatchBookmarks"] == "true"
    first = out.text()
    assert "gpu-0" not in first
    make_gpu0_unhealthy(api, "train-0")
    thread.join(timeout=20)
    assert not thread.is_alive() and codes == [3]
    tables = out.text().split("\n\n")
    assert len(tables) == 2 and tables[0] == first.rstrip("\n")
    assert "gpu-0" in tables[1] and "fell off the bus" in tables[1]
    assert list_rv.query.get("limit") == "500"
    assert_read_only(api)


def test_watch_lists_again_after_410_expired(api: FakeApiServer, demo: str) -> None:
    thread, out, codes = start_watch(
        demo, "devices", "-w", "--watch-max-redraws", "2", "--watch-seconds", "20", "-o", "json"
    )
    api.wait_for(lambda: any(r.is_watch for r in api.requests), timeout=10)
    make_gpu0_unhealthy(api, "train-1")
    api.expire_history()  # the change is lost from history; the next watch gets 410
    api.end_watches()
    thread.join(timeout=20)
    assert not thread.is_alive() and codes == [0]
    assert sum(1 for r in api.requests if r.path == "/api/v1/pods" and not r.is_watch) == 2
    docs = [json.loads(d) for d in out.text().replace("}\n{", "}\n\x00{").split("\x00")]
    assert [len(d["items"]) for d in docs] == [2, 3]


# -- the installed command ---------------------------------------------------------------------


def test_console_script_and_module_run_as_processes(demo: str) -> None:
    script = pathlib.Path(sys.executable).parent / "kubectl-dra_health"
    found = shutil.which("kubectl-dra_health") or (str(script) if script.exists() else None)
    assert found, "pip install put no kubectl-dra_health on PATH"
    for argv in ([found], [sys.executable, "-m", "kubelet_dra.kubectl"]):
        proc = subprocess.run(
            [*argv, "devices", "--kubeconfig", demo, "--fail-on", "Unhealthy"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 3, proc.stderr
        assert proc.stdout.splitlines()[1].split()[3] == "gpu-1"
    proc = subprocess.run(
        [found, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and "devices" in proc.stdout and "describe" in proc.stdout


def test_readme_and_operations_show_the_real_devices_output(demo: str) -> None:
    root = pathlib.Path(__file__).resolve().parents[2]
    code, text = run(demo, "devices")
    assert code == 0
    readme = (root / "README.md").read_text()
    shown = "\n".join("    " + line for line in text.splitlines())
    assert "    $ kubectl dra-health devices\n" + shown + "\n" in readme
    assert "$ kubectl dra-health devices\n" + text in (root / "docs" / "kubectl.md").read_text()


def test_kubectl_runs_the_plugin_found_on_path(demo: str, kubectl_bin: pathlib.Path) -> None:
    kubectl = str(kubectl_bin)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env["PATH"]])
    proc = subprocess.run(
        [kubectl, "dra-health", "devices", "--kubeconfig", demo, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert [i["device"] for i in json.loads(proc.stdout)["items"]] == ["gpu-1", "gpu-3"]


# tgkill and futex by architecture: a signal to one thread, and the wait of a lock.
_TGKILL, _FUTEX = {"x86_64": (234, 202), "aarch64": (131, 98)}.get(platform.machine(), (0, 0))


@pytest.fixture
def sigint_not_ignored() -> Iterator[None]:
    """SIGINT handled, not ignored, in the children started meanwhile.

    A test run started in the background by a shell without job control inherits
    SIGINT ignored; an exec keeps an ignored signal ignored, and Python then installs
    no KeyboardInterrupt handler, so no SIGINT could end the watch. A handler of ours
    is reset to the default by the exec, which is what a user's Ctrl-C finds.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _in_syscall(pid: int, tid: int) -> int | None:
    try:
        first = pathlib.Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
    except (OSError, IndexError):
        return None
    return int(first) if first.lstrip("-").isdigit() else None


@pytest.mark.skipif(not _TGKILL, reason="tgkill's syscall number is not known here")
@pytest.mark.usefixtures("sigint_not_ignored")
def test_a_ctrl_c_taken_by_another_thread_still_ends_a_watch(demo: str) -> None:
    # The kernel gives a process's SIGINT to any thread; Python runs the handler only
    # in the main thread, once that runs. A main thread asleep on the event queue with
    # no timeout never woke (seen in CI). Here the SIGINT goes to a thread that is not
    # the main one, always: the watch must still end, by its last output.
    argv = [sys.executable, "-m", "kubelet_dra.kubectl", "--kubeconfig", demo, "devices", "-w"]
    libc = ctypes.CDLL(None, use_errno=True)
    with subprocess.Popen(
        [*argv, "--fail-on", "Unhealthy"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith("NODE")
        # Once the feed thread runs and the main thread sleeps on the queue (a futex):
        # a signal sent before that is seen when the main thread next runs Python.
        others: list[int] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            others = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
            if others and _in_syscall(proc.pid, proc.pid) == _FUTEX:
                break
            time.sleep(0.01)
        try:
            assert others, "no thread but the main one"
            _sigint_one_of(libc, proc.pid, others)
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("the watch did not end on a SIGINT delivered to another thread")
        except BaseException:
            proc.kill()  # not left running for a later test's ResourceWarning
            raise
    assert proc.returncode == 3, err


def _sigint_one_of(libc: ctypes.CDLL, pid: int, threads: list[int]) -> None:
    """SIGINT to the first of ``threads`` still alive. A listed thread may end before the
    signal (a short-lived worker: ESRCH, seen in CI), so the next is tried."""
    for tid in threads:
        if libc.syscall(_TGKILL, pid, tid, signal.SIGINT) == 0:
            return
        if ctypes.get_errno() != errno.ESRCH:
            raise OSError(ctypes.get_errno(), f"tgkill of thread {tid}")
    raise AssertionError(f"every thread listed ended before the signal: {threads}")


@pytest.mark.usefixtures("sigint_not_ignored")
def test_interrupting_a_watch_exits_by_the_last_output(demo: str) -> None:
    argv = [sys.executable, "-m", "kubelet_dra.kubectl", "--kubeconfig", demo, "devices", "-w"]
    cases = (
        (["--fail-on", "Unhealthy"], "NODE", 3),
        (["--fail-on", "Unhealthy", "--node", "elsewhere", "-o", "json"], "{", 0),
    )
    # faulthandler on: a hang is answered with SIGABRT, which dumps every thread's stack.
    env = {**os.environ, "PYTHONFAULTHANDLER": "1"}
    for extra, first, expected in cases:
        with subprocess.Popen(
            [*argv, *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        ) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(first)  # the first output is out
            proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                _, err = proc.communicate(timeout=30)
                pytest.fail(f"no exit 30 s after SIGINT; the stacks at SIGABRT:\n{err}")
        assert proc.returncode == expected, err
        assert "Traceback" not in err
