"""The deployment files without an engine: deploy/compose.yaml's structure (only the worker gets the
Docker socket, the web replicas run no worker, one database URL for all), the systemd units' keys
(and `systemd-analyze verify` where systemd is installed) and the image's dependency closure."""

import importlib.util
import shutil
import subprocess
import tomllib
from collections import defaultdict
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
SOCKET = "/var/run/docker.sock"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return loaded


def forgehand_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if s["image"].startswith("forgehand-app:")}


def test_compose_services_and_images(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "web-1", "web-2", "worker"}
    for name, svc in forgehand_services(compose).items():
        assert svc["image"] == f"forgehand-app:{VERSION}", name
    # Nothing is pulled: every image must be present on the host.
    assert {s["pull_policy"] for s in services.values()} == {"never"}


def test_compose_only_the_worker_gets_the_docker_socket(compose: dict[str, Any]) -> None:
    mounting = {n for n, s in compose["services"].items() if any(SOCKET in str(v) for v in s.get("volumes", []))}
    assert mounting == {"worker"}
    assert compose["services"]["worker"]["group_add"]


def test_compose_web_replicas_serve_without_a_worker(compose: dict[str, Any]) -> None:
    services = compose["services"]
    for name in ("web-1", "web-2"):
        assert services[name]["command"] == ["forgehand", "serve"]
        assert services[name]["environment"]["FORGEHAND_RUN_WORKER"] == "false"
    assert services["worker"]["command"] == ["forgehand", "worker"]
    ports = [p.rsplit(":", 1)[0] for n in ("web-1", "web-2") for p in services[n]["ports"]]
    assert len(set(ports)) == 2 and all(p.startswith("127.0.0.1:") for p in ports)


def test_compose_one_database_and_one_data_directory(compose: dict[str, Any]) -> None:
    services = forgehand_services(compose)
    urls = {s["environment"]["FORGEHAND_DATABASE_URL"] for s in services.values()}
    assert len(urls) == 1
    assert next(iter(urls)).startswith("postgresql+asyncpg://") and "@postgres:5432/" in next(iter(urls))
    data = "${FORGEHAND_DATA_DIR:-/var/lib/forgehand}"
    for name, svc in services.items():
        # The data directory at the same path inside and out, and the one the process is told.
        assert f"{data}:{data}" in svc["volumes"], name
        assert svc["environment"]["FORGEHAND_DATA_DIR"] == data, name
        assert svc["depends_on"]["postgres"]["condition"] == "service_healthy"
    # The engine resolves the worker's mounts on the host: same path inside and out.
    channels = services["worker"]["environment"]["FORGEHAND_RUN_CHANNEL_DIR"]
    assert f"{channels}:{channels}" in services["worker"]["volumes"]


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in (DEPLOY / "systemd" / name).read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), defaultdict(list))
        else:
            key, _, value = line.partition("=")
            current[key].append(value)
    return sections


@pytest.mark.parametrize("name", ["forgehand.service", "forgehand-worker.service"])
def test_units_are_hardened(name: str) -> None:
    svc = unit(name)["Service"]
    assert svc["User"] == ["forgehand"]
    assert svc["NoNewPrivileges"] == ["true"]
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["ReadWritePaths"] == ["/var/lib/forgehand"]
    # The run channels live where the engine can see them, not in the unit's private /tmp.
    channels = next(e for e in svc["Environment"] if e.startswith("FORGEHAND_RUN_CHANNEL_DIR="))
    assert channels.split("=", 1)[1] == f"/run/{svc['RuntimeDirectory'][0]}"
    assert unit(name)["Install"]["WantedBy"] == ["multi-user.target"]


def test_worker_unit_runs_the_worker_in_the_docker_group() -> None:
    svc = unit("forgehand-worker.service")["Service"]
    assert svc["ExecStart"][0].endswith("forgehand worker")
    assert svc["SupplementaryGroups"] == ["docker"]
    assert "FORGEHAND_TASK_WORKSPACE_QUOTA=watchdog" in svc["Environment"]
    assert "docker.service" in unit("forgehand-worker.service")["Unit"]["Requires"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart exists: point it at one that does on this machine.
    for src in (DEPLOY / "systemd").glob("*.service"):
        text = src.read_text().replace("/opt/forgehand/.venv/bin/forgehand", "/bin/true")
        (tmp_path / src.name).write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", *sorted(str(p) for p in tmp_path.glob("*.service"))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def stage_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("deploy_app_stage", DEPLOY / "app" / "stage.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_image_dependencies_are_the_runtime_closure() -> None:
    stage = stage_module()
    names = {d.metadata["Name"].lower().replace("_", "-") for d in stage.dependency_closure()}
    assert {"litestar", "jinja2", "uvicorn", "pygit2", "asyncpg", "docker", "sqlalchemy"} <= names
    assert not names & {"pytest", "ruff", "mypy", "hypothesis", "playwright"}
    files = stage.package_files()
    assert Path("forge/app/cli.py") in files
    assert any(str(f).startswith("forge/db/migrations/versions/") for f in files)
    assert not any(f.parts[0] == "tests" for f in files)
