"""Interop: our registration validation against the kubelet v1.38's own code.

``validation/`` is a small Go program that calls ``DRAPluginManager.ValidatePlugin``
of ``k8s.io/kubernetes/pkg/kubelet/cm/dra/plugin`` at v1.38.0-beta.0 (built with the
go1.27.3 toolchain from the module proxy) for each driver name or endpoint on its
stdin. We feed it the fixed cases of ``tests/unit/test_registration_validation.py``
plus seeded random names and endpoints built from the characters that matter to Go's
``url.Parse``, ``strings.ToLower`` and the DNS-1123 pattern, and require the same
verdict from :func:`validation.validate_driver_name` and
:func:`validation.validate_endpoint` for every one.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest

from kubelet_dra import errors
from kubelet_dra.plugin import validation

from . import _build

pytestmark = [pytest.mark.interop, pytest.mark.timeout(3600)]  # a cold build takes minutes

_ARTIFACT = _build.GoArtifact(
    "validation-kubelet", "v1.38.0-beta.0", "validation", "validation-kubelet"
)
_build.ARTIFACTS.setdefault(_ARTIFACT.name, _ARTIFACT)
SEED, RANDOM_CASES = 11, 20_000

_ENDPOINT_PIECES = [*"/%2eE?#@:[]ab-._+fFg9 ", "\x00", "\x1f", "\x7f", "é", "\u0130"]
_ENDPOINT_PIECES += ["\u212a", "\U0001f600", "%2e%2e", "//", "%", "%zz", "%41", "%ff"]
_NAME_PIECES = [*"abcXYZ09-._/ ", "\u0130", "\u212a", "é", "\n", "ß", "ǅ"]
FIXED = [
    ("name", n)
    for n in [
        "", "gpu.example.com", "GPU.Example.COM", "gpu_example", "gpu.example.com.", "-gpu",
        "a" * 63, "a" * 64, "é" * 32, "\u0130ntel.com", "\u212aube.io", "gpu\n", "x..y",
    ]
] + [
    ("endpoint", e)
    for e in [
        "", "relative/x", "./x", "/plugins/%2e%2e/run/evil.sock", "/x?q", "/x?", "/x#frag",
        "/x#", "//host/x", "///x", "//user@/x", "/x\x00y", "/x\x7f", "/a b/c+d:e@f[g].sock",
        "/" + "x" * 106, "/" + "x" * 107, "/" + "é" * 53, "/" + "é" * 54, "/%", "/%4",
    ]
]  # fmt: skip


def _cases() -> list[tuple[str, str]]:
    rng = random.Random(SEED)
    cases = list(FIXED)
    for _ in range(RANDOM_CASES // 2):
        body = "".join(rng.choice(_ENDPOINT_PIECES) for _ in range(rng.randint(0, 12)))
        cases.append(("endpoint", "/" * rng.randint(0, 2) + body))
        size = rng.choice([rng.randint(0, 12), rng.randint(55, 70)])
        cases.append(("name", "".join(rng.choice(_NAME_PIECES) for _ in range(size))))
    return cases


def _ours(kind: str, text: str) -> bool:
    check = validation.validate_driver_name if kind == "name" else validation.validate_endpoint
    try:
        check(text)
    except errors.RegistrationError:
        return False
    return True


@pytest.fixture(scope="module")
def kubelet_validator() -> str:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("GOTOOLCHAIN", "go1.27.3")  # v1.38 needs Go 1.27
        try:
            return str(_build.ensure(_ARTIFACT.name))
        except _build.BuildUnavailable as exc:
            pytest.skip(exc.reason)


def test_every_verdict_matches_the_kubelet(kubelet_validator: str) -> None:
    cases = _cases()
    lines = "".join(json.dumps(list(case)) + "\n" for case in cases)
    answer = subprocess.run(
        [kubelet_validator], input=lines, capture_output=True, text=True, timeout=300, check=True
    )
    verdicts = answer.stdout.splitlines()
    assert len(verdicts) == len(cases)
    mismatches = [
        (kind, text, go)
        for (kind, text), go in zip(cases, verdicts, strict=True)
        if (go == "ok") is not _ours(kind, text)
    ]
    accepted = sum(v == "ok" for v in verdicts)
    print(f"\n{len(cases)} names and endpoints, {accepted} accepted by the kubelet, "
          f"{len(mismatches)} different verdicts")  # fmt: skip
    assert not mismatches[:20]
    assert 0 < accepted < len(cases)  # both verdicts occur: the comparison can fail
