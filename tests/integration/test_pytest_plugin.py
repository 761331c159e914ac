"""The test kit's pytest plugin: named apart from our fixtures, cheap to load, usable alone.

The plugin is loaded by every pytest run where the package is installed (tox installs
the wheel), ours included: its fixture names must not be those of any conftest under
``tests/`` (a conftest fixture silently wins over a plugin's), it must add nothing
autouse, and loading it must not import the kit (gRPC, the kubernetes client). The
run from an installed wheel, in a tree of its own, is ``tox -e package``'s
(``examples/driver-tests``). Under ``-m slow``, pytest subprocesses on this checkout
load the plugin by name: in pytest-asyncio's strict mode, which the async fixtures must
work in without a project's ``asyncio_mode = auto``, and without pytest-asyncio, where
they must say what is missing.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

from kubelet_dra.testing import pytest_plugin

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLUGIN = "kubelet_dra.testing.pytest_plugin"


def fixture_names(tree: ast.Module) -> set[str]:
    """Names of the ``@pytest.fixture`` (or ``pytest_asyncio.fixture``) functions in ``tree``."""
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for deco in node.decorator_list:
            call = deco.func if isinstance(deco, ast.Call) else deco
            text = ast.unparse(call)
            if text.endswith("fixture") or text == "_async_fixture":
                names = [
                    str(kw.value.value)
                    for kw in getattr(deco, "keywords", ())
                    if kw.arg == "name" and isinstance(kw.value, ast.Constant)
                ]
                found.update(names or [node.name])
    return found


def plugin_fixtures() -> set[str]:
    return fixture_names(ast.parse(pathlib.Path(pytest_plugin.__file__).read_text()))


def test_plugin_fixtures_are_prefixed_and_clash_with_no_conftest_fixture() -> None:
    ours = plugin_fixtures()
    assert ours >= {"kdra_sockdir", "kdra_driver", "kdra_api", "kdra_manager"}
    assert all(name.startswith("kdra_") for name in ours), ours
    clashes = {
        str(path.relative_to(ROOT)): sorted(ours & fixture_names(ast.parse(path.read_text())))
        for path in sorted((ROOT / "tests").rglob("conftest.py"))
    }
    assert {where: names for where, names in clashes.items() if names} == {}


def test_the_clash_check_sees_fixtures() -> None:
    source = textwrap.dedent(
        """
        @pytest.fixture
        def kdra_api(): ...
        @pytest.fixture(name="kdra_driver")
        async def _driver(): ...
        @pytest_asyncio.fixture(scope="session")
        async def other(): ...
        def helper(): ...
        """
    )
    assert fixture_names(ast.parse(source)) == {"kdra_api", "kdra_driver", "other"}


def test_pyproject_registers_the_plugin_module() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"kubelet_dra": PLUGIN}
    assert pytest_plugin.__name__ == PLUGIN


def test_loading_the_plugin_imports_neither_the_kit_nor_grpc_nor_kubernetes() -> None:
    code = (
        f"import sys, {PLUGIN}\n"
        "heavy = [m for m in ('grpc', 'kubernetes', 'kubelet_dra.testing.fakedriver',"
        " 'kubelet_dra.manager') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout


def _env() -> dict[str, str]:
    """This checkout first on the path; the plugin and pytest-asyncio loaded by name only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    return env


STRICT_TESTS = """
import pytest

from kubelet_dra import PreparedDevice
from kubelet_dra.testing import eventually, make_pod


@pytest.mark.asyncio
@pytest.mark.kdra_driver(name="nic.example.com")
async def test_driver_manager_and_pods(kdra_driver, kdra_manager, kdra_pods, kdra_settings):
    assert kdra_driver.name == "nic.example.com"
    assert kdra_driver.registration_socket.parent == kdra_settings.plugins_registry
    pod = kdra_pods.add(make_pod("p", claims=["c"]))
    kdra_manager.index.add_prepared_claim(
        namespace="default", name="c", pod_uids=[pod["metadata"]["uid"]],
        devices=[PreparedDevice("nic.example.com", "node-1", "nic-0")],
    )
    kdra_manager.set_pod(pod)
    await kdra_driver.set_health({"pool": "node-1", "device": "nic-0", "health": "Unhealthy"})
    await eventually(
        lambda: kdra_pods.health(pod["metadata"]["uid"]).entries[0].health == "Unhealthy"
    )


def test_api_and_its_client(kdra_api, kdra_kube_client):
    import kubernetes

    kdra_api.create_pod(make_pod("p"))
    version = kubernetes.client.VersionApi(kdra_kube_client)
    assert kdra_kube_client.configuration.host == kdra_api.url
    assert version is not None
"""


@pytest.mark.slow  # one pytest subprocess: 8 to 18 s on 2 loaded cores
def test_fixtures_work_in_strict_asyncio_mode(tmp_path: pathlib.Path) -> None:
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n"
        "filterwarnings =\n    error\n    ignore::DeprecationWarning:kubernetes.*\n"
        "    ignore::DeprecationWarning:dateutil.*\n"
    )
    (tmp_path / "test_kit.py").write_text(STRICT_TESTS)
    args = ["-p", "pytest_asyncio.plugin", "-p", PLUGIN, "-p", "no:cacheprovider", "-q"]
    out = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout


@pytest.mark.slow  # one pytest subprocess: 4 to 16 s on 2 loaded cores
def test_without_pytest_asyncio_the_async_fixtures_say_what_is_missing(
    tmp_path: pathlib.Path,
) -> None:
    hidden = tmp_path / "hidden"
    hidden.mkdir()
    (hidden / "pytest_asyncio.py").write_text("raise ImportError('not installed')\n")
    (tmp_path / "test_one.py").write_text(
        "def test_driver(kdra_driver):\n    pass\n\n"
        "def test_manager(kdra_manager):\n    pass\n\n"
        "def test_sockdir(kdra_sockdir):\n    assert kdra_sockdir.is_dir()\n"
    )
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(hidden), env["PYTHONPATH"]])
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "-rE"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert "2 errors" in out.stdout and "1 passed" in out.stdout, out.stdout[-3000:]
    for fixture in ("kdra_driver", "kdra_manager"):
        assert f"the {fixture} fixture needs pytest-asyncio" in out.stdout


def test_the_fixture_table_of_drivers_md_lists_exactly_the_plugins_fixtures() -> None:
    text = (ROOT / "docs" / "drivers.md").read_text()
    table = text[text.index("### Fixtures") :].split("\n\n")[1]
    rows = re.findall(r"^\| `(kdra_\w+)` \| (yes)? ?\|", table, re.MULTILINE)
    assert {name for name, _ in rows} == plugin_fixtures()
    module = ast.parse(pathlib.Path(pytest_plugin.__file__).read_text())
    async_ones = {n.name for n in ast.walk(module) if isinstance(n, ast.AsyncFunctionDef)}
    assert {name for name, is_async in rows if is_async} == async_ones
