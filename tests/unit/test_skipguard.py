"""The CI skip guard (tests/_skipguard.py): its rules, and the hooks of the root conftest run
in an inner pytest session, with CI set and not."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests import _skipguard

pytest_plugins = ["pytester"]

ENTRY = _skipguard.Allowed("tests/e2e/*1.38*", r"kubelet-1\.38 unavailable", "the proxy refuses")


@pytest.mark.parametrize(
    ("value", "on"),
    [("true", True), ("1", True), ("yes", True), ("", False), ("false", False), ("0", False)],
)
def test_ci_is_on_for_a_yes_and_off_for_a_no(value: str, on: bool) -> None:
    assert _skipguard.ci_enabled({"CI": value}) is on
    assert _skipguard.ci_enabled({}) is False


def test_an_entry_allows_only_its_tests_and_its_reason() -> None:
    guard = _skipguard.Guard([ENTRY])
    guard.collected(["tests/e2e/test_x.py::test_a[1.38-on]", "tests/e2e/test_x.py::test_a[1.37]"])
    assert guard.judge("tests/e2e/test_x.py::test_a[1.37]", "kubelet-1.38 unavailable") is None
    assert guard.judge("tests/e2e/test_x.py::test_a[1.38-on]", "Go toolchain not found") is None
    assert guard.stale() == [ENTRY]
    assert guard.judge("tests/e2e/test_x.py::test_a[1.38-on]", "e2e: kubelet-1.38 unavailable: 403")
    assert guard.stale() == []


def test_an_entry_that_applies_to_no_test_of_the_run_is_not_stale() -> None:
    guard = _skipguard.Guard([ENTRY])
    guard.collected(["tests/unit/test_cli.py::test_x"])
    assert guard.stale() == []


def test_the_allow_list_loads_and_every_entry_says_why() -> None:
    entries = _skipguard.load()
    assert entries, "tests/allowed-skips.toml has the 1.38 e2e line"
    assert all(e.why.strip() and e.reason and e.test for e in entries)


def test_an_entry_without_a_reason_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "allow.toml"
    path.write_text('[[skip]]\ntest = "tests/x*"\nwhy = "because"\n')
    with pytest.raises(ValueError, match="lacks reason"):
        _skipguard.load(path)


def test_skip_reason_is_taken_from_the_report_tuple() -> None:
    assert _skipguard.skip_reason(("f.py", 3, "Skipped: no Go")) == "no Go"


# -- the hooks, in an inner session -------------------------------------------------

INNER_TESTS = """
    import pytest

    def test_runs():
        pass

    def test_no_go():
        pytest.skip("interop: etcd unavailable: Go toolchain not found on PATH")

    def test_allowed_line():
        pytest.skip("the proxy refuses this one")

    @pytest.mark.xfail(reason="known", strict=False)
    def test_expected_failure():
        raise AssertionError
"""


def _inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, allow: str,
           ci: str) -> pytest.RunResult:  # fmt: skip
    """Run INNER_TESTS with the root conftest's hooks and ``allow`` as the allow-list."""
    allow_file = pytester.path / "allowed.toml"
    allow_file.write_text(textwrap.dedent(allow))
    monkeypatch.setattr(_skipguard, "ALLOW_FILE", allow_file)
    monkeypatch.setenv("CI", ci)
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_inner=textwrap.dedent(INNER_TESTS))
    return pytester.runpytest_inprocess("-p", "tests.conftest", "-p", "no:cacheprovider")


ALLOW_LINE = """
    [[skip]]
    test = "*test_allowed_line"
    reason = "proxy refuses"
    why = "a test of the guard"
"""


def test_under_ci_a_skip_that_is_not_allowed_fails(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _inner(pytester, monkeypatch, ALLOW_LINE, "true")
    result.assert_outcomes(passed=1, failed=1, skipped=1, xfailed=1)
    result.stdout.fnmatch_lines(["*skipped under CI: interop: etcd unavailable*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED


def test_without_ci_a_skip_is_a_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = _inner(pytester, monkeypatch, ALLOW_LINE, "")
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    assert result.ret == pytest.ExitCode.OK


def test_under_ci_an_entry_that_allowed_nothing_fails_the_run(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    allow = (
        ALLOW_LINE
        + """
    [[skip]]
    test = "*test_no_go"
    reason = "Go toolchain not found"
    why = "a test of the guard"

    [[skip]]
    test = "*test_runs"
    reason = "anything"
    why = "stale: test_runs never skips"
    """
    )
    result = _inner(pytester, monkeypatch, allow, "true")
    result.assert_outcomes(passed=1, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["*entries that allowed no skip*", "*test='*test_runs'*"])
    assert result.ret == pytest.ExitCode.TESTS_FAILED
