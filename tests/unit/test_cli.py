"""``kubelet-dra-health`` parsing: flags, environment variables, exit codes, logging.

Everything here fails before the sidecar starts (no sockets, no API server);
``tests/integration/test_sidecar_*.py`` run the command as a subprocess.
"""

from __future__ import annotations

import io
import json
import logging
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kubelet_dra import cli, errors, settings

# flag, flag value, env value, Settings field, value from the flag, value from the env
CASES = [
    ("--node-name", "n-flag", "n-env", "node_name", "n-flag", "n-env"),
    (
        "--kubeconfig",
        "/flag/kubeconfig",
        "/env/kubeconfig",
        "kubeconfig",
        pathlib.Path("/flag/kubeconfig"),
        pathlib.Path("/env/kubeconfig"),
    ),
    (
        "--plugins-registry",
        "/flag/reg",
        "/env/reg",
        "plugins_registry",
        pathlib.Path("/flag/reg"),
        pathlib.Path("/env/reg"),
    ),
    (
        "--state-dir",
        "/flag/state",
        "/env/state",
        "state_dir",
        pathlib.Path("/flag/state"),
        pathlib.Path("/env/state"),
    ),
    # Issue 39: the kubelet's PodResources API (CDI device IDs); empty turns it off.
    (
        "--pod-resources-socket",
        "/srv/kubelet/pod-resources/kubelet.sock",
        "",
        "pod_resources_socket",
        pathlib.Path("/srv/kubelet/pod-resources/kubelet.sock"),
        None,
    ),
    ("--kubelet-field-grace", "0", "5", "kubelet_field_grace", 0.0, 5.0),
    ("--health-timeout", "7", "9.5", "health_timeout", 7.0, 9.5),
    (
        "--container-status",
        "off",
        "on",
        "container_status",
        settings.ContainerStatusMode.OFF,
        settings.ContainerStatusMode.ON,
    ),
    ("--pod-condition-type", "FlagCond", "EnvCond", "pod_condition_type", "FlagCond", "EnvCond"),
    (
        "--metrics-address",
        "0.0.0.0:1",
        "127.0.0.1:2",
        "metrics_address",
        "0.0.0.0:1",
        "127.0.0.1:2",
    ),
    ("--api-qps", "20", "5.5", "api_qps", 20.0, 5.5),
    ("--api-burst", "40", "10", "api_burst", 40, 10),
    ("--write-concurrency", "4", "2", "write_concurrency", 4, 2),
    ("--pod-list-page-size", "0", "50", "pod_list_page_size", 0, 50),
    ("--malloc-trim-interval", "0", "300", "malloc_trim_interval", 0.0, 300.0),
    ("--malloc-arena-max", "0", "4", "malloc_arena_max", 0, 4),
    ("--malloc-trim-threshold", "0", "1048576", "malloc_trim_threshold", 0, 1048576),
    # The taint bridge (issue 13).
    (
        "--taint-effect",
        "NoExecute",
        "None",
        "taint_effect",
        settings.TaintEffect.NO_EXECUTE,
        settings.TaintEffect.NONE,
    ),
    ("--taint-after", "0", "2.5", "taint_after", 0.0, 2.5),
    ("--taint-unknown-after", "600", "never", "taint_unknown_after", 600.0, None),
    ("--untaint-after", "0", "120", "untaint_after", 0.0, 120.0),
    ("--taint-key", "example.com/broken", "gpu-bad", "taint_key", "example.com/broken", "gpu-bad"),
]
IDS = [case[0] for case in CASES]
DEFAULTS = {
    "node_name": "",
    "kubeconfig": None,
    "plugins_registry": pathlib.Path("/var/lib/kubelet/plugins_registry"),
    "state_dir": pathlib.Path("/var/lib/kubelet-dra-health"),
    "pod_resources_socket": pathlib.Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
    "kubelet_field_grace": 20.0,
    "health_timeout": 30.0,
    "container_status": settings.ContainerStatusMode.AUTO,
    "pod_condition_type": "DeviceHealthy",
    "metrics_address": "127.0.0.1:9464",
    "api_qps": 50.0,
    "api_burst": 100,
    "write_concurrency": 8,
    "pod_list_page_size": 10,
    "malloc_trim_interval": 60.0,
    "malloc_arena_max": 2,
    "malloc_trim_threshold": 131072,
    "taint_effect": settings.TaintEffect.OFF,
    "taint_after": 10.0,
    "taint_unknown_after": None,
    "untaint_after": 60.0,
    "taint_key": "kubelet-dra.io/unhealthy",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No configuration from the developer's shell; logging restored after main()."""
    for _flag, (_field, env, _text) in cli.RUN_FLAGS.items():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("GRPC_VERBOSITY", "ERROR")
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def parse(*argv: str) -> settings.Settings:
    return cli.run_settings(cli.build_parser().parse_args(["run", *argv]))


def env_of(flag: str) -> str:
    return cli.RUN_FLAGS[flag][1]


def test_every_flag_of_the_contract_is_defined() -> None:
    assert [c[0] for c in CASES] == list(cli.RUN_FLAGS)


def test_run_never_reads_the_kubelets_checkpoint(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The earlier manifests' root dir variable is ignored, and says so."""
    assert "--kubelet-root-dir" not in cli.RUN_FLAGS
    monkeypatch.setenv("KUBELET_DRA_KUBELET_ROOT_DIR", "/host/var/lib/kubelet")
    with caplog.at_level(logging.WARNING):
        parsed = parse()
    assert parsed.kubelet_root_dir is None
    assert "(KUBELET_DRA_KUBELET_ROOT_DIR) is ignored" in caplog.text


def test_the_earlier_manifests_root_dir_flag_still_starts_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``--kubelet-root-dir`` is a contract of the earlier manifests: accepted, ignored, said."""
    with caplog.at_level(logging.WARNING):
        parsed = parse("--kubelet-root-dir", "/host/var/lib/kubelet")
    assert parsed.kubelet_root_dir is None
    assert "--kubelet-root-dir (KUBELET_DRA_KUBELET_ROOT_DIR) is ignored" in caplog.text


def test_defaults_without_flags_or_environment() -> None:
    parsed = parse()
    assert {field: getattr(parsed, field) for field in DEFAULTS} == DEFAULTS
    assert parsed.role is settings.Role.OBSERVER


@pytest.mark.parametrize(
    ("flag", "flag_value", "_env", "field", "expected", "_from_env"), CASES, ids=IDS
)
def test_flag_sets_its_field(
    flag: str, flag_value: str, _env: str, field: str, expected: object, _from_env: object
) -> None:
    assert getattr(parse(flag, flag_value), field) == expected


@pytest.mark.parametrize(
    ("flag", "_flag_value", "env_value", "field", "_from_flag", "expected"), CASES, ids=IDS
)
def test_environment_is_used_when_the_flag_is_absent(
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    _flag_value: str,
    env_value: str,
    field: str,
    _from_flag: object,
    expected: object,
) -> None:
    monkeypatch.setenv(env_of(flag), env_value)
    assert getattr(parse(), field) == expected


@pytest.mark.parametrize(
    ("flag", "flag_value", "env_value", "field", "expected", "_from_env"), CASES, ids=IDS
)
def test_flag_wins_over_environment(
    monkeypatch: pytest.MonkeyPatch,
    flag: str,
    flag_value: str,
    env_value: str,
    field: str,
    expected: object,
    _from_env: object,
) -> None:
    monkeypatch.setenv(env_of(flag), env_value)
    assert getattr(parse(flag, flag_value), field) == expected


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--pod-condition-type", ""), ("--metrics-address", "")],
    ids=["condition-disabled", "metrics-disabled"],
)
def test_empty_string_disables(flag: str, value: str) -> None:
    field = cli.RUN_FLAGS[flag][0]
    assert getattr(parse("--node-name", "n", flag, value), field) == ""


def test_empty_kubeconfig_variable_means_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "")
    assert parse().kubeconfig is None


def run_main(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(cli.main(list(argv)))
    err = capsys.readouterr().err
    code = exited.value.code
    assert isinstance(code, int)
    return code, [line for line in err.splitlines() if line.strip()]


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["run", "--node-name", "n", "--health-timeout", "-1"], {}, "--health-timeout"),
        (["run", "--node-name", "n", "--health-timeout", "soon"], {}, "--health-timeout"),
        (["run", "--node-name", "n", "--container-status", "bogus"], {}, "--container-status"),
        (["run"], {}, "--node-name"),
        (["run", "--node-name", ""], {}, "--node-name"),
        (["run", "--node-name", "n", "--metrics-address", "nohost"], {}, "metrics address"),
        (["run", "--node-name", "n", "--metrics-address", "h:port"], {}, "metrics address"),
        (
            ["run"],
            {"NODE_NAME": "n", "KUBELET_DRA_HEALTH_TIMEOUT": "0"},
            "KUBELET_DRA_HEALTH_TIMEOUT",
        ),
        (["run"], {"NODE_NAME": "n", "KUBELET_DRA_CONTAINER_STATUS": "x"}, "--container-status"),
        (["run", "--no-such-flag"], {}, "--no-such-flag"),
        ([], {}, "required"),
    ],
    ids=[
        "negative-timeout",
        "timeout-not-a-number",
        "bad-container-status",
        "missing-node-name",
        "empty-node-name",
        "address-without-port",
        "address-port-not-a-number",
        "env-zero-timeout",
        "env-bad-container-status",
        "unknown-flag",
        "no-command",
    ],
)
def test_bad_configuration_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    env: dict[str, str],
    needle: str,
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code, lines = run_main(capsys, *argv)
    assert code == cli.EXIT_USAGE
    assert len(lines) == 1, lines
    assert needle in lines[0]
    assert "Traceback" not in lines[0]


def kubeconfig_cases(tmp: pathlib.Path) -> dict[str, tuple[pathlib.Path, str]]:
    (tmp / "text").write_text("just some text\n")
    (tmp / "broken").write_text("clusters: [\n")
    (tmp / "incomplete").write_text("apiVersion: v1\nkind: Config\n")
    (tmp / "dir").mkdir()
    return {
        "missing": (tmp / "missing", "is not a readable file"),
        "directory": (tmp / "dir", "is not a readable file"),
        "not-a-mapping": (tmp / "text", "not a YAML mapping"),
        "not-yaml": (tmp / "broken", "not valid YAML"),
        "no-context": (tmp / "incomplete", "kubeconfig"),
    }


@pytest.mark.parametrize(
    "case", ["missing", "directory", "not-a-mapping", "not-yaml", "no-context"]
)
@pytest.mark.parametrize("via", ["flag", "env"])
def test_unusable_kubeconfig_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: pathlib.Path,
    case: str,
    via: str,
) -> None:
    path, needle = kubeconfig_cases(tmp_path)[case]
    argv = ["run", "--node-name", "n", "--state-dir", str(tmp_path / "state")]
    if via == "flag":
        argv += ["--kubeconfig", str(path)]
    else:
        monkeypatch.setenv("KUBECONFIG", str(path))
    code, lines = run_main(capsys, *argv)
    assert code == cli.EXIT_USAGE
    assert len(lines) == 1, lines
    assert needle in lines[0] and str(path) in lines[0]
    # Nothing started: the state directory was not even created.
    assert not (tmp_path / "state").exists()


def test_unreadable_kubeconfig_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path
) -> None:
    # Root reads any file, so make reading fail the way a permission error does.
    target = tmp_path / "kubeconfig"
    target.write_text("apiVersion: v1\n")

    def refuse(self: pathlib.Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "read_bytes", refuse)
    from kubelet_dra import kube

    with pytest.raises(errors.ConfigError, match="cannot be read: Permission denied"):
        kube.load_client(target)


def test_version_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip()


@pytest.mark.parametrize(
    ("verbosity", "ours", "libraries"),
    [
        (0, logging.INFO, logging.WARNING),
        (1, logging.DEBUG, logging.WARNING),
        (2, logging.DEBUG, logging.DEBUG),
    ],
    ids=["default", "-v", "-vv"],
)
def test_verbosity_levels(verbosity: int, ours: int, libraries: int) -> None:
    cli.configure_logging(verbosity, "text")
    assert logging.getLogger().level == ours
    assert logging.getLogger("kubernetes").level == libraries
    assert logging.getLogger("grpc").level == libraries


@pytest.mark.parametrize(
    ("argv", "verbose", "fmt"),
    [
        (["run"], 0, "text"),
        (["-v", "run"], 1, "text"),
        (["run", "-vv"], 2, "text"),
        (["-v", "run", "-v"], 1, "text"),
        (["--log-format", "json", "run"], 0, "json"),
        (["run", "--log-format", "json"], 0, "json"),
    ],
    ids=["none", "before", "after", "after-wins", "json-before", "json-after"],
)
def test_logging_flags_before_or_after_the_command(argv: list[str], verbose: int, fmt: str) -> None:
    ns = cli.build_parser().parse_args(argv)
    assert (ns.verbose, ns.log_format) == (verbose, fmt)


def test_json_log_format_writes_one_json_object_per_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    cli.configure_logging(1, "json")
    log = logging.getLogger("kubelet_dra.test")
    log.debug("driver %s registered", "gpu.example.com")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("stream failed")
    entries = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [e["level"] for e in entries] == ["debug", "error"]
    assert entries[0]["msg"] == "driver gpu.example.com registered"
    assert entries[0]["logger"] == "kubelet_dra.test"
    assert "ValueError: boom" in entries[1]["exc"]
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["--taint-after", "-1"], "--taint-after (or KUBELET_DRA_TAINT_AFTER)"),
        (["--untaint-after", "soon"], "--untaint-after (or KUBELET_DRA_UNTAINT_AFTER)"),
        (["--taint-key", "not a key"], "--taint-key (or KUBELET_DRA_TAINT_KEY)"),
        (
            ["--taint-unknown-after", "-5"],
            "--taint-unknown-after (or KUBELET_DRA_TAINT_UNKNOWN_AFTER)",
        ),
    ],
)
def test_bad_taint_settings_name_the_flag(argv: list[str], where: str) -> None:
    with pytest.raises(errors.ConfigError, match=re.escape(f"invalid {where}")):
        parse(*argv)


def test_taint_effect_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("--taint-effect", "PreferNoSchedule")
    assert exited.value.code == 2
    assert "(choose from 'off', 'None', 'NoSchedule', 'NoExecute')" in capsys.readouterr().err


def test_run_parses_the_same_without_the_other_tools() -> None:
    argv = ["-v", "run", "--node-name", "n1", "--api-qps", "7", "--log-format", "json"]
    assert cli._command(argv) == "run"
    assert vars(cli.build_parser("run").parse_args(argv)) == vars(
        cli.build_parser().parse_args(argv)
    )


def test_the_run_parser_does_not_import_the_test_kit() -> None:
    # A sidecar start must not pay for the demo's and fake driver's imports.
    code = (
        "import sys; from kubelet_dra import cli; cli.build_parser('run'); "
        "print(sorted(m for m in sys.modules if m.startswith(('kubelet_dra.testing', 'yaml'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
