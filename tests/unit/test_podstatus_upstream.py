"""The kubelet's manager_test.go status cases (reference section 6.2), as tables.

``TestUpdateAllocatedResourcesStatus``, ``..._Subrequest``,
``TestBuildResourceHealth``, ``TestToResourceHealthStatus`` and
``TestTruncateHealthMessage``, run against :mod:`kubelet_dra.status.podstatus` on
plain dicts.
"""

from __future__ import annotations

from typing import Any

import pytest

from kubelet_dra import models
from kubelet_dra.state import healthinfo
from kubelet_dra.status import claims, podstatus
from tests.unit import _podstatus_builders as b

H = models.HealthStatus
DRV = "test-driver"


def _status_for(
    pod: dict[str, Any], index: claims.ClaimIndex, message: str
) -> list[dict[str, Any]]:
    new = podstatus.update_allocated_resources_status(
        pod, pod["status"], index=index, health_of=lambda _k: b.healthy(message), now=b.NOW
    )
    return podstatus.container_entries(new, claims.CONTAINERS, "container1")


# (case id, pod claim entry, status mapping or None, object name, device, share ID, expected name)
CLAIM_CASES = [
    ("direct", {"name": "claim1", "resourceClaimName": "direct-claim-name"},
     "direct-claim-name", "direct-claim-name", "dev-a", None, "claim:claim1"),
    ("renamed", {"name": "renamed-pod-claim", "resourceClaimName": "renamed-claim-object"},
     "renamed-claim-object", "renamed-claim-object", "dev-b", None, "claim:renamed-pod-claim"),
    ("templated", {"name": "templated-claim", "resourceClaimTemplateName": "tmpl"},
     "pod-templated-templated-claim", "pod-templated-templated-claim", "dev-c", None,
     "claim:templated-claim"),
    ("shareid", {"name": "shareid-claim", "resourceClaimName": "shareid-claim-object"},
     "shareid-claim-object", "shareid-claim-object", "dev-shared", "share-1",
     "claim:shareid-claim"),
    # 1.36+ fallback: the status mapping is not filled yet, resourceClaimName resolves.
    ("direct-no-status", {"name": "claim1", "resourceClaimName": "direct-claim-name"},
     None, "direct-claim-name", "dev-a", None, "claim:claim1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod_claim", "mapped", "obj", "device", "share", "name"),
    [c[1:] for c in CLAIM_CASES],
    ids=[c[0] for c in CLAIM_CASES],
)
def test_update_allocated_resources_status_names_entry_by_pod_claim_reference(
    pod_claim: dict[str, str], mapped: str | None, obj: str, device: str, share: str | None,
    name: str,
) -> None:  # fmt: skip
    ref = pod_claim["name"]
    statuses = None if mapped is None else [{"name": ref, "resourceClaimName": mapped}]
    pod = b.pod(
        claims=[pod_claim], statuses=statuses, containers=[b.container("container1", (ref, ""))],
        container_statuses=[{"name": "container1"}],
    )  # fmt: skip
    index = claims.ClaimIndex()
    index.set_pod(pod)
    index.add_prepared_claim(
        namespace="default", name=obj,
        devices=[claims.PreparedDevice(DRV, "pool", device, share_id=share)],
    )  # fmt: skip
    assert _status_for(pod, index, "Device is operating normally") == [
        {
            "name": name,
            "resources": [
                {
                    "resourceID": f"{DRV}/pool/{device}",
                    "health": "Healthy",
                    "message": "Device is operating normally",
                }
            ],
        }
    ]


def test_template_claim_without_status_mapping_is_skipped() -> None:
    pod = b.pod(
        claims=[{"name": "t", "resourceClaimTemplateName": "tmpl"}],
        containers=[b.container("container1", ("t", ""))],
        container_statuses=[{"name": "container1"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    assert _status_for(pod, index, "") == []


SUBREQUEST_CASES = [
    ("base-with-subrequest", "req-base/sub", True),
    ("other-request-pruned", "req-other/sub", False),
    ("base-request", "req-base", True),
    ("no-request", "", True),
]


@pytest.mark.parametrize(
    ("request_name", "reported"),
    [c[1:] for c in SUBREQUEST_CASES],
    ids=[c[0] for c in SUBREQUEST_CASES],
)
def test_update_allocated_resources_status_filters_by_base_request(
    request_name: str, reported: bool
) -> None:
    pod = b.pod(
        claims=[{"name": "my-claim", "resourceClaimName": "my-claim"}],
        containers=[b.container("container1", ("my-claim", request_name))],
        container_statuses=[{"name": "container1"}],
    )
    index = claims.ClaimIndex()
    index.set_pod(pod)
    device = claims.PreparedDevice(DRV, "test-pool", "test-device", request_names=("req-base",))
    index.add_prepared_claim(namespace="default", name="my-claim", devices=[device])
    entries = _status_for(pod, index, "Device healthy")
    if not reported:
        assert entries == []
        return
    assert entries == [
        {
            "name": podstatus.status_name("my-claim", request_name),
            "resources": [
                {
                    "resourceID": f"{DRV}/test-pool/test-device",
                    "health": "Healthy",
                    "message": "Device healthy",
                }
            ],
        }
    ]


BUILD_CASES = [
    ("cdi-id-wins", ("driver/pool=device",), H.HEALTHY, "ok", True,
     {"resourceID": "driver/pool=device", "health": "Healthy", "message": "ok"}),
    ("message-disabled", ("driver/pool=device",), H.HEALTHY, "ok", False,
     {"resourceID": "driver/pool=device", "health": "Healthy"}),
    ("empty-message-omitted", (), H.HEALTHY, "", True,
     {"resourceID": "driver/pool/device", "health": "Healthy"}),
    ("unhealthy", (), H.UNHEALTHY, "bad", True,
     {"resourceID": "driver/pool/device", "health": "Unhealthy", "message": "bad"}),
    ("unknown", (), H.UNKNOWN, "", True, {"resourceID": "driver/pool/device", "health": "Unknown"}),
    ("no-cdi-ids", (), H.HEALTHY, "", True,
     {"resourceID": "driver/pool/device", "health": "Healthy"}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cdi", "health", "message", "with_message", "expected"),
    [c[1:] for c in BUILD_CASES],
    ids=[c[0] for c in BUILD_CASES],
)
def test_build_resource_health(
    cdi: tuple[str, ...], health: H, message: str, with_message: bool, expected: dict[str, str]
) -> None:
    device = claims.PreparedDevice("driver", "pool", "device", cdi_ids=cdi)
    got = podstatus.resource_health(device, health, message, with_message=with_message)
    assert got == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("Healthy", H.HEALTHY),
        ("Unhealthy", H.UNHEALTHY),
        ("Unknown", H.UNKNOWN),
        ("", H.UNKNOWN),
        ("Other", H.UNKNOWN),
    ],
    ids=["healthy", "unhealthy", "unknown", "empty", "other"],
)
def test_to_resource_health_status(value: str, expected: H) -> None:
    assert podstatus.to_resource_health_status(value) is expected


@pytest.mark.parametrize(
    ("message", "expected_len", "truncated"),
    [("", 0, False), ("short", 5, False), ("x" * 1024, 1024, False),
     ("x" * 1025, 1024, True), ("x" * 2048, 1024, True)],
    ids=["empty", "short", "exactly-limit", "one-over", "double"],
)  # fmt: skip
def test_truncate_health_message(message: str, expected_len: int, truncated: bool) -> None:
    out = healthinfo.truncate_message(message)
    assert len(out.encode()) == expected_len
    assert out == (message[:1021] + "..." if truncated else message)
