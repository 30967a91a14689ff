"""A repository's environment, end to end with the real engine, real git and a command task: a
`.forgehand/environment.yml` whose setup installs the locked requirements from a PEP 503 index on
127.0.0.1 (the test's) through a setup-only egress rule with a setup-only index token; the first
task builds it (its `environment` event with the log), runs with the package importable, no network
and no token; the second starts from the cache; a changed lock file rebuilds; a failing setup fails
the task `environment_setup` with its log tail; a setup that keeps the token fails
`secret_in_environment` and keeps nothing."""

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import docker
import msgspec
import pygit2
import pytest

from forge.core.settings import Settings
from forge.db.engine import Database
from forge.git import Identity
from forge.git.bare import write_commit
from sandbox.pool import LIVE_POOLS
from sandbox.spec import LABEL_POOL
from tasks.core.models import EnvironmentImage
from tasks.run.warm import LABEL_WORKER
from tests.support.anthropic import ScriptedAnthropic, tool_use
from tests.support.anthropic import text as claude_text
from tests.support.egress import origin_server, simple_index
from tests.support.tasks import (
    Env,
    all_events,
    containers_of,
    output_text,
    serve_env,
    served,
    start,
    tree_files,
    wait_state,
)
from tests.support.waiting import until

pytestmark = pytest.mark.docker

TOKEN = "idx-token-7f3c9a1e5b2d"
SECRETS = "/api/v1/repos/ana/demo/actions/secrets"
TASKS = "/api/v1/repos/ana/demo/tasks"
KEY = "sk-ant-instance-key-claude-0123456789"
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
            page = (await c.get(f"/ana/demo/tasks/{first['number']}")).text
            second = await start(c, PROBE)
            again = await wait_state(c, second["number"], "awaiting_review", "failed", timeout=240)
            cached = environment_events(await all_events(c, second["number"]))
            commit(env, {"requirements.txt": "forgehand-probe==1.0\n# pinned\n"}, "lock")
            third = await start(c, PROBE)
            rebuilt_task = await wait_state(c, third["number"], "awaiting_review", "failed", timeout=240)
            rebuilt = environment_events(await all_events(c, third["number"]))
            # A forced rebuild (repository admins): the next task builds again, whatever is cached.
            forced = await c.post("/api/v1/repos/ana/demo/environment/rebuild")
            assert forced.status_code == 200 and forced.json() == {"generation": 1}, forced.text
            fourth = await start(c, PROBE)
            assert (await wait_state(c, fourth["number"], "awaiting_review", "failed", timeout=240))["state"] == (
                "awaiting_review"
            )
            after_rebuild = environment_events(await all_events(c, fourth["number"]))
    files = {path: data.decode() for path, (_, data) in tree_files(env.repo_path, done["head_sha"]).items()}
    assert files["probe.txt"].strip() == "42"  # the package the setup installed
    assert files["net.txt"].startswith("000")  # the run has no network: curl reached nothing
    assert TOKEN not in json.dumps(files) and "INDEX_TOKEN" not in files["seen.txt"]
    # The index was reached by the setup (once: the later tasks did not reach it), which had the token.
    assert any(path.startswith("/simple/forgehand-probe") for _, path, _ in index.requests)
    assert "the index token is there" in built[-1]["detail"]["log"]
    assert built[-1]["detail"]["cached"] is False and "Successfully installed" in built[-1]["detail"]["log"]
    assert TOKEN not in json.dumps(built)
    # The task page shows the build among the phases, its log folded under "setup log".
    assert "environment built in" in page and "<summary>setup log</summary>" in page
    assert "Successfully installed forgehand-probe-1.0" in page  # (the page shows the probe command, token and all)
    assert again["state"] == "awaiting_review" and [e["detail"]["cached"] for e in cached] == [True]
    assert cached[0]["detail"]["image"] == built[-1]["detail"]["image"]
    assert rebuilt_task["state"] == "awaiting_review" and rebuilt[-1]["detail"]["cached"] is False
    assert rebuilt[-1]["detail"]["image"] != built[-1]["detail"]["image"]
    assert after_rebuild[-1]["detail"]["cached"] is False
    assert after_rebuild[-1]["detail"]["image"] not in (built[-1]["detail"]["image"], rebuilt[-1]["detail"]["image"])
    client = docker.from_env()
    try:
        image = client.images.get(built[-1]["detail"]["image"])
        assert TOKEN not in json.dumps(image.attrs) and TOKEN not in json.dumps(image.history())
    finally:
        client.close()


async def test_a_failing_setup_fails_the_task_with_its_log_and_a_leaking_one_keeps_nothing(env: Env) -> None:
    async with env.client() as c:
        # Another repository's secret of that name is not this one's: the setup would not start.
        assert (await c.post("/api/v1/user/repos", json={"name": "other"})).status_code == 201
        other = "/api/v1/repos/ana/other/actions/secrets/INDEX_TOKEN"
        assert (await c.put(other, json={"value": TOKEN})).status_code == 201
        commit(env, {".forgehand/environment.yml": environment_yml(1, "true")}, "needs a secret")
        unsecret = await wait_state(c, (await start(c, "true"))["number"], "awaiting_review", "failed", timeout=240)
        assert unsecret["failure_reason"] == "environment_setup" and "INDEX_TOKEN" in unsecret["error"], unsecret
        assert (await c.put(f"{SECRETS}/INDEX_TOKEN", json={"value": TOKEN})).status_code == 201
        broken = environment_yml(1, "echo token=$(cat /run/secrets/INDEX_TOKEN); echo no index here >&2; exit 3")
        commit(env, {"requirements.txt": "x\n", ".forgehand/environment.yml": broken}, "broken")
        failed = await wait_state(c, (await start(c, "true"))["number"], "awaiting_review", "failed", timeout=240)
        failed_events = await all_events(c, failed["number"])
        leak = "cat /run/secrets/INDEX_TOKEN > /opt/env/token.txt"
        commit(env, {".forgehand/environment.yml": environment_yml(1, leak)}, "leak")
        leaked = await wait_state(c, (await start(c, "true"))["number"], "awaiting_review", "failed", timeout=240)
        leak_events = environment_events(await all_events(c, leaked["number"]))
    assert failed["state"] == "failed" and failed["failure_reason"] == "environment_setup", failed
    assert "exit 3" in failed["error"] and "no index here" in failed["error"]
    # The setup printed the token into its log: the transcript and the error show it redacted.
    assert "token=[REDACTED]" in json.dumps(failed_events) and TOKEN not in json.dumps(failed_events)
    assert leaked["state"] == "failed" and leaked["failure_reason"] == "secret_in_environment", leaked
    assert "INDEX_TOKEN" in leaked["error"] and TOKEN not in json.dumps(leaked)
    image = leak_events[-1]["detail"]["image"]
    client = docker.from_env()
    try:
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(image)
    finally:
        client.close()


async def two_tasks_at_once(env: Env) -> tuple[list[int], list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
    async with env.client() as c:
        numbers = [(await start(c, PROBE))["number"] for _ in range(2)]
        done = [await wait_state(c, n, "awaiting_review", "failed", timeout=240) for n in numbers]
        return numbers, done, {n: await all_events(c, n) for n in numbers}


DEVCONTAINER = """{
  // the team's devcontainer, with what forgehand needs in its customizations
  "name": "demo",
  "image": "sandbox",
  "onCreateCommand": "curl -s -m 5 -o /dev/null http://127.0.0.1:%(closed)d/ || echo not reachable",
  "postCreateCommand": [
    "python3", "-m", "pip", "install", "--no-cache-dir", "--target", "/opt/env/lib",
    "--index-url", "http://127.0.0.1:%(port)d/simple/", "-r", "requirements.txt"
  ],
  "containerEnv": {"PYTHONPATH": "/opt/env/lib"},
  "customizations": {
    "vscode": {"extensions": ["ms-python.python"]},
    "forgehand": {"setup_egress": ["127.0.0.1:%(port)d"], "cache_files": ["requirements.txt"]},
  },
}"""


def test_a_devcontainer_environment_builds_once_for_two_tasks_and_its_setup_egress_is_held(
    settings: Settings, sandbox_image: str
) -> None:
    """Two tasks start together on a cold cache (the repository runs two at once): one builds, the
    other waits and starts from the image. The setup's request to a port outside its rules is
    refused and recorded on the building task with phase `environment`."""
    with origin_server(simple_index("forgehand-probe")) as index, origin_server({}) as closed:
        devcontainer = DEVCONTAINER % {"port": index.port, "closed": closed.port}
        s = msgspec.structs.replace(settings, egress_allowed_hosts="127.0.0.1", task_repo_concurrency=2)
        files = {"requirements.txt": "forgehand-probe==1.0\n", ".devcontainer/devcontainer.json": devcontainer}
        for env in serve_env(s):
            commit(env, files, "dev")
            numbers, done, events = asyncio.run(two_tasks_at_once(env))
        remove_environment_images(s)
    failures = [(d["state"], d["runs"][-1].get("failure_reason"), d["runs"][-1].get("error")) for d in done]
    assert [d["state"] for d in done] == ["awaiting_review", "awaiting_review"], failures
    outcomes = sorted(str(environment_events(events[n])[-1]["text"]).split(" ")[1] for n in numbers)
    assert outcomes == ["built", "from"]  # "environment built in N s", "environment from the cache"
    [builder] = [n for n in numbers if environment_events(events[n])[-1]["detail"]["cached"] is False]
    blocked = [e["payload"] for e in events[builder] if e["kind"] == "egress_blocked"]
    assert [(b["port"], b["phase"]) for b in blocked] == [(closed.port, "environment")]
    assert blocked[0]["text"].startswith("during the environment's setup: egress refused")
    assert closed.requests == []  # the refused port was never reached
    for n in numbers:
        files = tree_files(env.repo_path, done[numbers.index(n)]["head_sha"])
        assert files["probe.txt"][1].strip() == b"42"


CALC = "import forgehand_probe\n\n\ndef answer():\n    return forgehand_probe.VALUE + 1\n"
TEST_CALC = (
    "import unittest\n\nimport calc\n\n\nclass T(unittest.TestCase):\n"
    "    def test_answer(self):\n        self.assertEqual(calc.answer(), 42)\n"
)
RUN_TESTS = "cd /workspace && python3 -m unittest -v test_calc 2>&1; echo exit=$?"


async def test_a_claude_code_task_runs_the_projects_tests_in_its_environment_and_fixes_one(
    settings: Settings, agents_image: str
) -> None:
    """The walkthrough with the real Claude Code CLI: a Python project whose test needs a package the
    environment installs from the test's index (setup-only egress and token). The agent runs the
    tests (they fail: 43, not 42), fixes the code, runs them again (they pass), all with no network;
    the environment was built for it (on the agents image, which holds the CLI) and the token is
    nowhere in the run."""
    turns = [
        tool_use("Bash", {"command": RUN_TESTS, "description": "run the tests"}, id="toolu_red"),
        tool_use("Write", {"file_path": "/workspace/calc.py", "content": CALC.replace(" + 1", "")}, id="toolu_fix"),
        tool_use("Bash", {"command": RUN_TESTS, "description": "run them again"}, id="toolu_green"),
        claude_text("Fixed answer(): the tests pass."),
    ]
    with origin_server(simple_index("forgehand-probe")) as index, ScriptedAnthropic(turns) as api:
        model = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
        async with served(settings, egress_allowed_hosts="127.0.0.1", **model) as (env, c):
            files = {
                "requirements.txt": "forgehand-probe==1.0\n", ".forgehand/environment.yml": environment_yml(index.port),
                "calc.py": CALC, "test_calc.py": TEST_CALC,
            }  # fmt: skip
            commit(env, files, "a project with a failing test")
            assert (await c.put(f"{SECRETS}/INDEX_TOKEN", json={"value": TOKEN})).status_code == 201
            r = await c.post(TASKS, json={"goal": "make the tests pass", "agent": "fixer", "runtime": "claude-code"})
            assert r.status_code == 201, r.text
            done = await wait_state(c, r.json()["number"], "awaiting_review", "failed", timeout=300)
            events = await all_events(c, done["number"])
        remove_environment_images(env.settings)
    assert done["state"] == "awaiting_review", done
    [building, built] = environment_events(events)
    assert building["text"].startswith("building the environment") and built["detail"]["cached"] is False
    assert built["detail"]["image"].startswith("forgehand-env:")
    results = {e["payload"]["id"]: e["payload"]["output"] for e in events if e["kind"] == "tool_result"}
    assert "FAILED" in results["toolu_red"] and "exit=1" in results["toolu_red"]
    assert "OK" in results["toolu_green"] and "exit=0" in results["toolu_green"]
    assert tree_files(env.repo_path, done["head_sha"])["calc.py"][1].decode() == CALC.replace(" + 1", "")
    assert TOKEN not in json.dumps(events) and TOKEN not in json.dumps(api.requests)


async def test_a_task_on_another_branch_gets_the_default_branchs_environment(env: Env) -> None:
    """Whoever can push a branch (the agent's own, a pull request's head) does not choose the setup
    that gets the repository's secrets: a task based on a branch whose environment file differs
    runs in the default branch's environment, and the branch's setup never runs."""
    main_env = json.dumps({"image": "sandbox", "setup": "echo from-main > /opt/env/marker"})
    branch_env = json.dumps({"image": "sandbox", "setup": "echo from-branch > /opt/env/marker"})
    commit(env, {".forgehand/environment.yml": main_env}, "main's environment")
    repo = pygit2.Repository(str(env.repo_path))
    repo.references.create("refs/heads/feature", repo.references["refs/heads/main"].target)
    files = {".forgehand/environment.yml": branch_env.encode()}
    write_commit(repo, branch="feature", files=files, message="the branch's environment", author=ANA)
    async with env.client() as c:
        task = await start(c, "cat /opt/env/marker > marker.txt", base="feature")
        done = await wait_state(c, task["number"], "awaiting_review", "failed", timeout=240)
        built = environment_events(await all_events(c, task["number"]))
        # A repository admin's declaration in the settings takes the file's place.
        in_settings = "image: sandbox\nsetup: echo from-settings > /opt/env/marker\n"
        r = await c.put("/api/v1/repos/ana/demo/environment", json={"declaration": in_settings})
        assert r.status_code == 200, r.text
        second = await start(c, "cat /opt/env/marker > marker.txt")
        settled = await wait_state(c, second["number"], "awaiting_review", "failed", timeout=240)
        from_settings = environment_events(await all_events(c, second["number"]))
        # An admin's override for one task: a step after the setup, in an image of its own.
        override = {"extra_setup": "echo extra > /opt/env/extra"}
        third = await start(c, "cat /opt/env/marker /opt/env/extra > both.txt", environment_override=override)
        overridden = await wait_state(c, third["number"], "awaiting_review", "failed", timeout=240)
        override_events = environment_events(await all_events(c, third["number"]))
        # "Check environment" (repository admins): a command task in the environment, no agent.
        r = await c.post("/api/v1/repos/ana/demo/environment/check", json={"command": "cat /opt/env/marker"})
        assert r.status_code == 201 and r.json()["title"] == "Check environment" and r.json()["runtime"] == "command"
        checked = await wait_state(c, r.json()["number"], "awaiting_review", "failed", timeout=240)
        check_output = output_text(await all_events(c, checked["number"]))
    assert done["state"] == "awaiting_review", done
    assert tree_files(env.repo_path, done["head_sha"])["marker.txt"][1] == b"from-main\n"
    assert "from-branch" not in json.dumps(built)
    assert tree_files(env.repo_path, settled["head_sha"])["marker.txt"][1] == b"from-settings\n"
    assert from_settings[-1]["detail"]["source"] == "the repository's settings"
    assert tree_files(env.repo_path, overridden["head_sha"])["both.txt"][1] == b"from-settings\nextra\n"
    assert override_events[-1]["detail"]["source"] == "the repository's settings, with the task's override"
    assert override_events[-1]["detail"]["image"] != from_settings[-1]["detail"]["image"]
    assert checked["state"] == "awaiting_review" and "from-settings" in check_output, checked


def test_an_operators_extra_image_is_a_base_an_environment_may_name(settings: Settings, sandbox_image: str) -> None:
    """FORGEHAND_ENVIRONMENT_EXTRA_IMAGES: a local image (here the sandbox image under another
    name, with a marker file a toolchain would be) that an environment names; an image the
    operator did not list is refused with the allowed ones named."""
    client = docker.from_env()
    extra = f"forgehand-test-toolchain:{settings.instance_id[:12] or 'x'}"
    client.images.get(sandbox_image).tag(extra)
    s = msgspec.structs.replace(settings, environment_extra_images=extra)
    try:
        for env in serve_env(s):
            commit(env, {".forgehand/environment.yml": json.dumps({"image": extra, "setup": "true"})}, "extra")
            ok = asyncio.run(run_one(env, "true"))
            commit(env, {".forgehand/environment.yml": json.dumps({"image": "rust:latest"})}, "not listed")
            refused = asyncio.run(run_one(env, "true"))
        remove_environment_images(s)
    finally:
        client.images.remove(extra, force=True)
        client.close()
    assert ok[0]["state"] == "awaiting_review", ok[0]
    assert ok[1][-1]["detail"]["base"] == extra
    assert refused[0]["failure_reason"] == "environment_setup" and "rust:latest" in refused[0]["error"]
    assert extra in refused[0]["error"]  # the allowed images are named


async def run_one(env: Env, command: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    async with env.client() as c:
        number = (await start(c, command))["number"]
        done = await wait_state(c, number, "awaiting_review", "failed", timeout=240)
        return done, environment_events(await all_events(c, number))


async def test_the_worker_keeps_warm_sandboxes_of_an_environment(settings: Settings, agents_image: str) -> None:
    """With FORGEHAND_TASK_SANDBOX_POOL=1, an environment's image gets a pool of its own once a task
    used it: the next claude-code task on that environment takes a warm sandbox of it."""
    turns = [tool_use("Bash", {"command": "cat /opt/env/marker > seen.txt", "description": "x"}), claude_text("done")]
    with ScriptedAnthropic(turns * 2) as api:
        model = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
        async with served(settings, task_sandbox_pool=1, **model) as (env, c):
            declared = json.dumps({"image": "agents", "setup": "echo warm > /opt/env/marker"})
            commit(env, {".forgehand/environment.yml": declared}, "an environment")
            results = []
            for number in (1, 2):
                r = await c.post(TASKS, json={"goal": f"look {number}", "agent": "fixer", "runtime": "claude-code"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, number, "awaiting_review", "failed", timeout=240)
                events = await all_events(c, number)
                results.append((done, events))
                tag = environment_events(events)[-1]["detail"]["image"]
                await until(
                    lambda tag=tag: any(p.ready and p.template.image == tag for p in list(LIVE_POOLS.values())),
                    timeout=60,
                    what="a warm sandbox of the environment's image",
                )
                # Pooled sandboxes are the worker's, labelled as its runs' are (or none would match).
                idle = [x for x in containers_of(env.settings) if LABEL_POOL in x.labels]
                assert idle and {x.labels.get(LABEL_WORKER) for x in idle} == {done["runs"][-1]["worker"]}
        remove_environment_images(env.settings)
    sandboxes = []
    for done, events in results:
        assert done["state"] == "awaiting_review", done
        assert tree_files(env.repo_path, done["head_sha"])["seen.txt"][1] == b"warm\n"
        sandboxes.append(
            next(e["payload"] for e in events if e["kind"] == "system" and e["payload"]["phase"] == "sandbox")
        )
    assert [s["detail"]["pooled"] for s in sandboxes] == [False, True]


def test_an_image_an_instance_admin_registered_is_a_base_an_environment_may_name(
    settings: Settings, sandbox_image: str
) -> None:
    """The same as the operator's list, for an image registered in the instance (as
    `POST /api/v1/admin/environment-images` stores it): the run reads the registrations."""
    client = docker.from_env()
    registered = f"forgehand-test-registered:{settings.instance_id[:12] or 'x'}"
    client.images.get(sandbox_image).tag(registered)
    try:
        for env in serve_env(settings):
            asyncio.run(register_image(env.settings, registered))
            commit(env, {".forgehand/environment.yml": json.dumps({"image": registered, "setup": "true"})}, "reg")
            done, events = asyncio.run(run_one(env, "true"))
        remove_environment_images(settings)
    finally:
        client.images.remove(registered, force=True)
        client.close()
    assert done["state"] == "awaiting_review", done
    assert events[-1]["detail"]["base"] == registered


async def register_image(settings: Settings, reference: str) -> None:
    db = Database(settings.effective_database_url)
    try:
        async with db.session(write=True) as s:
            s.add(EnvironmentImage(reference=reference, note="test"))
    finally:
        await db.dispose()


async def test_a_registered_image_serves_a_cli_agent_only_when_it_holds_the_same_agent_clis(
    settings: Settings, agents_image: str, sandbox_image: str
) -> None:
    """A claude-code task on an environment naming a registered image: one built FROM the agents
    image (here: a tag of it, same agent labels) is the base; one without the CLIs (the plain
    sandbox image under another name) is not, and the run starts from the agents image instead."""
    client = docker.from_env()
    suffix = settings.instance_id[:12] or "x"
    with_clis, without = f"forgehand-test-team-agents:{suffix}", f"forgehand-test-team-plain:{suffix}"
    client.images.get(agents_image).tag(with_clis)
    client.images.get(sandbox_image).tag(without)
    bases = []
    try:
        with ScriptedAnthropic([claude_text("one"), claude_text("two")]) as api:
            model = {"anthropic_base_url": api.url, "anthropic_api_key": KEY, "anthropic_model": "claude-test"}
            async with served(settings, **model) as (env, c):
                for image in (with_clis, without):
                    await register_image(env.settings, image)
                    commit(env, {".forgehand/environment.yml": json.dumps({"image": image, "setup": "true"})}, image)
                    r = await c.post(TASKS, json={"goal": "go", "agent": "fixer", "runtime": "claude-code"})
                    assert r.status_code == 201, r.text
                    done = await wait_state(c, r.json()["number"], "awaiting_review", "failed", timeout=240)
                    assert done["state"] == "awaiting_review", done
                    bases.append(environment_events(await all_events(c, done["number"]))[-1]["detail"]["base"])
            remove_environment_images(env.settings)
    finally:
        client.images.remove(with_clis, force=True)
        client.images.remove(without, force=True)
        client.close()
    assert bases == [with_clis, agents_image]
