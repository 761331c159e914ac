"""The CI log's last lines (.ci/summary.py): one per tox environment, its pytest counts from
its junit file, its seconds and its exit code from tox's result JSON."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / ".ci" / "summary.py"


def _summary() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ci_summary", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest"
 errors="1" failures="2" skipped="3" tests="20" time="12.5"></testsuite></testsuites>"""


def test_each_environment_gets_its_counts_seconds_and_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "junit"
    junit.mkdir()
    (junit / "py.xml").write_text(JUNIT)
    result = {"testenvs": {
        "py": {"result": {"duration": 512.4, "exit_code": 1}},
        "lint": {"result": {"duration": 3.2, "exit_code": 0}},
        ".pkg": {"python": {}},
        "fuzz": {},
    }}  # fmt: skip
    (tmp_path / "result.json").write_text(json.dumps(result))
    assert _summary().main([str(tmp_path / "result.json"), str(junit)]) == 0
    py, lint = capsys.readouterr().out.splitlines()
    assert py.split() == ["[ci]", "py", "14", "passed,", "2", "failed,", "1", "errors,", "3",
                          "skipped", "512", "s", "exit", "1"]  # fmt: skip
    assert lint.split() == ["[ci]", "lint", "no", "pytest", "3", "s", "exit", "0"]


def test_no_result_file_says_tox_did_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _summary().main([str(tmp_path / "none.json"), str(tmp_path)]) == 0
    assert "tox did not get to run" in capsys.readouterr().out
