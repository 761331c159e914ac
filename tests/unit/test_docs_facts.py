"""The facts the documentation quotes from the code are the code's.

Pages name flags, environment variables, tox environments, Event reasons and the pod
condition's reasons; each of those is a contract someone types or greps for. A page that
names one the code does not have (renamed, removed, misspelt) fails here, with the page.
"""

from __future__ import annotations

import configparser
import pathlib
import re
import shlex

import pytest

from kubelet_dra import cli, settings
from kubelet_dra.kube import events, gates
from kubelet_dra.kubectl import _cli as kubectl_cli
from kubelet_dra.status import podstatus

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"])
#: Where the test knobs (``KUBELET_DRA_*`` variables read by tests, not by the sidecar) live.
KNOB_SOURCES = ("tests", "benchmarks", ".ci", "deploy", "tox.ini")

_CODE = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def _page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def _code_lines(text: str) -> list[str]:
    """Inline code spans and the lines of fenced or indented code blocks."""
    lines = [m.group(1) for m in _CODE.finditer(text)]
    for block in _FENCE.finditer(text):
        lines += block.group(1).splitlines()
    lines += [line[4:] for line in text.splitlines() if line.startswith("    ")]
    return lines


def _flags_of(parser: object) -> set[str]:
    import argparse

    assert isinstance(parser, argparse.ArgumentParser)
    found: set[str] = set()
    for action in parser._actions:
        found.update(s for s in action.option_strings if s.startswith("--"))
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= _flags_of(sub)
    return found


def _commands(line: str, program: str) -> list[list[str]]:
    """The argument lists of every ``program`` command on this line.

    The program must start its command (after ``VAR=value`` words or ``sudo``), so a Helm
    release or a namespace named like it is not taken for it.
    """
    out = []
    size = len(program.split())
    for part in re.split(r"\s*(?:&&|\|\||;|\|)\s*", line):
        try:
            words = shlex.split(part, comments=True)
        except ValueError:
            words = part.split()
        while words and (re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]) or words[0] == "sudo"):
            words = words[1:]
        if " ".join(words[:size]) == program:
            out.append(words[size:])
    return out


OURS = {
    "kubelet-dra-health": _flags_of(cli.build_parser()),
    "kubectl dra-health": _flags_of(kubectl_cli.build_parser()),
}


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_flag_of_our_commands_on_a_page_exists(page: pathlib.Path) -> None:
    unknown = set()
    for line in _code_lines(page.read_text()):
        for program, flags in OURS.items():
            for args in _commands(line, program):
                for arg in args:
                    name = arg.split("=", 1)[0]
                    if name.startswith("--") and name not in flags:
                        unknown.add(f"{program} {name}")
    assert not unknown, f"{_page_id(page)} names flags the commands do not have: {unknown}"


def _setting_variables() -> set[str]:
    named = {env for _flag, (_field, env, _text) in cli.RUN_FLAGS.items()}
    return named | {f"KUBELET_DRA_{name.upper()}" for name in settings.Settings.model_fields}


def _knobs() -> set[str]:
    found: set[str] = set()
    for source in KNOB_SOURCES:
        path = ROOT / source
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        for file in files:
            if file.suffix in {".py", ".ini", ".sh", ".yaml", ".yml", ".toml", ""}:
                try:
                    found.update(re.findall(r"KUBELET_DRA_[A-Z0-9_]+", file.read_text()))
                except (UnicodeDecodeError, OSError):
                    continue
    return found


KNOWN_VARIABLES = _setting_variables() | _knobs()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_environment_variable_on_a_page_is_read_somewhere(page: pathlib.Path) -> None:
    named = set(re.findall(r"KUBELET_DRA_[A-Z0-9_]*[A-Z0-9]", page.read_text()))
    unknown = named - KNOWN_VARIABLES
    assert not unknown, f"{_page_id(page)} names variables nothing reads: {sorted(unknown)}"


def _tox() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(ROOT / "tox.ini")
    return parser


TOX = _tox()
TOX_ENVS = {s.removeprefix("testenv:") for s in TOX.sections() if s.startswith("testenv:")} | {"py"}
ENV_LIST = [e.strip() for e in TOX["tox"]["env_list"].split(",")]


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_tox_environment_on_a_page_exists(page: pathlib.Path) -> None:
    named = set(re.findall(r"tox -e ([a-z0-9-]+)", page.read_text()))
    assert not named - TOX_ENVS, f"{_page_id(page)} names tox environments: {named - TOX_ENVS}"


def test_the_testing_page_names_every_environment_of_the_default_run() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    missing = [env for env in ENV_LIST if not re.search(rf"\b{re.escape(env)}\b", text)]
    assert not missing, f"docs/testing.md does not name these env_list environments: {missing}"


#: A reason as pages name one: "reason `X`", "reason: X", "(reason `X`)".
_REASON_LIKE = re.compile(r"\breason:?\s+`?([A-Z][A-Za-z]+)`?")


#: Kubernetes' own reasons that pages quote: the API server's ``Status`` answers, container
#: states and Job conditions.
API_STATUS_REASONS = {
    *("Forbidden", "Conflict", "NotFound", "Invalid", "Expired", "TooManyRequests"),
    *("Error", "Completed", "OOMKilled", "CrashLoopBackOff", "ContainerCreating"),
    *("BackoffLimitExceeded", "PodFailurePolicy"),
}


def test_every_event_or_condition_reason_on_a_page_exists() -> None:
    reasons = {r for r, _kind in events._REASON.values()} | {
        podstatus.REASON_HEALTHY,
        podstatus.REASON_UNHEALTHY,
        podstatus.REASON_UNKNOWN,
        settings.Settings.model_fields["pod_condition_type"].default,
        *API_STATUS_REASONS,
    }
    reasons |= {
        getattr(module, name)
        for module in (events, gates)
        for name in dir(module)
        if name.isupper() and name.endswith("_REASON") and not name.startswith("_")
    }
    unknown = {
        (_page_id(page), match)
        for page in PAGES
        for match in _REASON_LIKE.findall(page.read_text())
        if match not in reasons
    }
    assert not unknown, f"reasons the code does not have: {sorted(unknown)}"
