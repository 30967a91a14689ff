"""A repository's environment, end to end with the real engine, real git and a command task: a
`.forgehand/environment.yml` whose setup installs the locked requirements from a PEP 503 index on
127.0.0.1 (the test's) through a setup-only egress rule with a setup-only index token; the first
task builds it (its `environment` event with the log), runs with the package importable, no network
and no token; the second starts from the cache; a changed lock file rebuilds; a failing setup fails
the task `environment_setup` with its log tail; a setup that keeps the token fails
`secret_in_environment` and keeps nothing."""

import json
from collections.abc import Iterator
from typing import Any

import docker
import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from forge.git import Identity
from forge.git.bare import write_commit
from tests.support.egress import origin_server, simple_index
from tests.support.tasks import Env, all_events, serve_env, start, tree_files, wait_state

pytestmark = pytest.mark.docker

TOKEN = "idx-token-7f3c9a1e5b2d"
SECRETS = "/api/v1/repos/ana/demo/actions/secrets"
ANA = Identity(name="ana", email="ana@example.com")
# What the agent's run checks, into files the task commits: the package is there, the index is not
# reachable (no egress for the run), the token is nowhere in its environment or files.
PROBE = (
    "python3 -c 'import forgehand_probe; print(forgehand_probe.VALUE)' > probe.txt 2>&1; "
    "(curl -s -m 3 -o /dev/null -w '%{http_code}' http://127.0.0.1:$INDEX_PORT/simple/ || echo unreachable) > net.txt; "
    "(env; ls -la /run/secrets 2>&1; grep -rl " + TOKEN + " /opt/env 2>/dev/null) > seen.txt; true"
)


def environment_yml(port: int, setup: str = "") -> str:
    install = (
        "test -s /run/secrets/INDEX_TOKEN && echo the index token is there; "
        "python3 -m pip install --no-cache-dir --disable-pip-version-check --target /opt/env/lib "
        f'--index-url "http://token:$(cat /run/secrets/INDEX_TOKEN)@127.0.0.1:{port}/simple/" -r requirements.txt'
    )
    script = setup or install
    return json.dumps(
        {
            "image": "sandbox",
            "setup": script,
            "env": {"PYTHONPATH": "/opt/env/lib", "INDEX_PORT": str(port)},
            "setup_egress": [f"127.0.0.1:{port}"],
            "setup_secrets": ["INDEX_TOKEN"],
            "cache_files": ["requirements.txt"],
            "timeout_seconds": 120,
        }
    )  # JSON is YAML


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(msgspec.structs.replace(settings, egress_allowed_hosts="127.0.0.1"))
    remove_environment_images(settings)


def remove_environment_images(settings: Settings) -> None:
    client = docker.from_env()
    try:
        for image in client.images.list(filters={"label": f"forgehand.instance={settings.instance_id}"}):
            if any(tag.startswith("forgehand-env:") for tag in image.tags):
                client.images.remove(image.id, force=True)
    finally:
        client.close()


def commit(env: Env, files: dict[str, str], message: str) -> None:
    repo = pygit2.Repository(str(env.repo_path))
    write_commit(repo, branch="main", files={p: c.encode() for p, c in files.items()}, message=message, author=ANA)


def environment_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["kind"] == "system" and e["payload"]["phase"] == "environment"]


async def test_an_environment_is_built_once_reused_and_rebuilt_when_its_lock_file_changes(env: Env) -> None:
    with origin_server(simple_index("forgehand-probe")) as index:
        declared = {
            "requirements.txt": "forgehand-probe==1.0\n",
            ".forgehand/environment.yml": environment_yml(index.port),
        }
        commit(env, declared, "env")
        async with env.client() as c:
            r = await c.put(f"{SECRETS}/INDEX_TOKEN", json={"value": TOKEN})
            assert r.status_code == 201, r.text
            first = await start(c, PROBE)
            done = await wait_state(c, first["number"], "awaiting_review", "failed", timeout=240)
            assert done["state"] == "awaiting_review", done
            built = environment_events(await all_events(c, first["number"]))
            second = await start(c, PROBE)
            again = await wait_state(c, second["number"], "awaiting_review", "failed", timeout=240)
            cached = environment_events(await all_events(c, second["number"]))
            commit(env, {"requirements.txt": "forgehand-probe==1.0\n# pinned\n"}, "lock")
            third = await start(c, PROBE)
            rebuilt_task = await wait_state(c, third["number"], "awaiting_review", "failed", timeout=240)
            rebuilt = environment_events(await all_events(c, third["number"]))
    files = {path: data.decode() for path, (_, data) in tree_files(env.repo_path, done["head_sha"]).items()}
    assert files["probe.txt"].strip() == "42"  # the package the setup installed
    assert files["net.txt"].startswith("000")  # the run has no network: curl reached nothing
    assert TOKEN not in json.dumps(files) and "INDEX_TOKEN" not in files["seen.txt"]
    # The index was reached by the setup (once: the later tasks did not reach it), which had the token.
    assert any(path.startswith("/simple/forgehand-probe") for _, path, _ in index.requests)
    assert "the index token is there" in built[-1]["detail"]["log"]
    assert [e["detail"]["cached"] for e in built][-1] is False and "Successfully installed" in built[-1]["detail"][
        "log"
    ]
    assert TOKEN not in json.dumps(built)
    assert again["state"] == "awaiting_review" and [e["detail"]["cached"] for e in cached] == [True]
    assert cached[0]["detail"]["image"] == built[-1]["detail"]["image"]
    assert rebuilt_task["state"] == "awaiting_review" and rebuilt[-1]["detail"]["cached"] is False
    assert rebuilt[-1]["detail"]["image"] != built[-1]["detail"]["image"]
    client = docker.from_env()
    try:
        image = client.images.get(built[-1]["detail"]["image"])
        assert TOKEN not in json.dumps(image.attrs) and TOKEN not in json.dumps(image.history())
    finally:
        client.close()


async def test_a_failing_setup_fails_the_task_with_its_log_and_a_leaking_one_keeps_nothing(env: Env) -> None:
    async with env.client() as c:
        assert (await c.put(f"{SECRETS}/INDEX_TOKEN", json={"value": TOKEN})).status_code == 201
        broken = environment_yml(1, "echo no index here >&2; exit 3")
        commit(env, {"requirements.txt": "x\n", ".forgehand/environment.yml": broken}, "broken")
        failed = await wait_state(c, (await start(c, "true"))["number"], "awaiting_review", "failed", timeout=240)
        leak = "cat /run/secrets/INDEX_TOKEN > /opt/env/token.txt"
        commit(env, {".forgehand/environment.yml": environment_yml(1, leak)}, "leak")
        leaked = await wait_state(c, (await start(c, "true"))["number"], "awaiting_review", "failed", timeout=240)
        leak_events = environment_events(await all_events(c, leaked["number"]))
    assert failed["state"] == "failed" and failed["failure_reason"] == "environment_setup", failed
    assert "exit 3" in failed["error"] and "no index here" in failed["error"]
    assert leaked["state"] == "failed" and leaked["failure_reason"] == "secret_in_environment", leaked
    assert "INDEX_TOKEN" in leaked["error"] and TOKEN not in json.dumps(leaked)
    image = leak_events[-1]["detail"]["image"]
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(image)
    finally:
        client.close()
