"""The agents image on the real engine: built and cached, labelled with the pinned versions, the
CLI and the managed settings in place and root's, and the hook bridge and relay against real Unix
sockets on the host through the run's channel mount."""

import asyncio
import json
import secrets
import shutil
import socketserver
import subprocess
import threading
import time
from pathlib import Path

import docker
import msgspec
import pytest
from click.testing import CliRunner

from sandbox import (
    AGENT_PINS,
    AgentMissing,
    ExecResult,
    Sandbox,
    SandboxEngine,
    build_agents_image,
    installed_agents,
)
from sandbox.cli import sandbox_group
from sandbox.images.acp_adapters import ACP_ADAPTER_PINS
from sandbox.images.agent_files import (
    CODEX_REQUIREMENTS,
    CODEX_REQUIREMENTS_PATH,
    MANAGED_SETTINGS,
    MANAGED_SETTINGS_PATH,
)
from sandbox.images.agents_image import agents_cache_dir
from tests.docker.conftest import SpecFactory
from tests.support.channel import FakeChannel, HookCall, Reply, allow, deny, reply_json

CLAUDE_VERSION = AGENT_PINS["claude-code"].version
CODEX_VERSION = AGENT_PINS["codex"].version


def test_build_is_cached_and_labelled(docker_client: docker.DockerClient, agents_image: str) -> None:
    t0 = time.monotonic()
    result = build_agents_image(agents_image)
    assert result.built is False and result.recipe == "cached"
    assert time.monotonic() - t0 < 5
    cfg = docker_client.images.get(agents_image).attrs["Config"]
    assert cfg["Labels"]["org.forgehand.agent.claude-code"] == CLAUDE_VERSION
    assert cfg["User"] == "1000:1000"
    assert cfg["WorkingDir"] == "/workspace"


def test_cli_build_agents_is_idempotent_and_fails_clearly_without_npm(
    agents_image: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    done = CliRunner().invoke(sandbox_group, ["build", "--agents"])
    assert done.exit_code == 0, done.output
    said = " ".join(done.output.split())
    assert f"{agents_image} is up to date (claude-code {CLAUDE_VERSION}, codex {CODEX_VERSION})" in said
    # A forced build on a host without npm and an empty cache: a clear error, exit 1.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", "/usr/sbin:/sbin")  # no npm (nor node) here
    tag = f"forgehand-sandbox-agents:no-npm-{secrets.token_hex(3)}"
    failed = CliRunner().invoke(sandbox_group, ["build", "--agents", "--image", tag])
    assert failed.exit_code == 1
    assert "npm is needed to install @anthropic-ai/claude-code@" in " ".join(failed.output.split())


async def test_installed_agents_and_the_missing_cases(engine: SandboxEngine, agents_image: str) -> None:
    cached = await engine.ensure_agents_image(agents_image)
    assert cached.recipe == "cached" and not cached.built
    adapters = {name: pin.version for name, pin in ACP_ADAPTER_PINS.items()}
    assert await installed_agents(engine, agents_image) == {
        "claude-code": CLAUDE_VERSION,
        "codex": CODEX_VERSION,
        **adapters,
    }
    assert await engine.require_agent("claude-code", agents_image) == CLAUDE_VERSION
    assert await engine.require_agent("codex", agents_image) == CODEX_VERSION
    with pytest.raises(AgentMissing, match="has no gemini") as caught:
        await engine.require_agent("gemini", agents_image)
    assert "forgehand sandbox build --agents" in str(caught.value)
    absent = f"forgehand-sandbox-agents:absent-{secrets.token_hex(3)}"
    assert await installed_agents(engine, absent) == {}
    with pytest.raises(AgentMissing, match="is missing"):
        await engine.require_agent("claude-code", absent)


async def test_starting_a_missing_agents_image_says_how_to_build_it(
    engine: SandboxEngine, make_spec: SpecFactory
) -> None:
    with pytest.raises(AgentMissing) as caught:
        await engine.start(make_spec(image=f"forgehand-sandbox-agents:absent-{secrets.token_hex(3)}"))
    assert "forgehand sandbox build --agents" in str(caught.value)


async def test_a_changed_pin_rebuilds(docker_client: docker.DockerClient, agents_image: str) -> None:
    """Over 30 s: it builds the agents image twice (a changed pin, then back), which is what it
    checks; the CLIs come from the cache, never from npm."""
    # Another pinned version, its binary already in the cache (hard links to the real one, so npm
    # is not asked): the labels no longer match, so the image is rebuilt; back to the real pin, it
    # is rebuilt again. Under a throwaway tag.
    pin = AGENT_PINS["claude-code"]
    moved = msgspec.structs.replace(pin, version=f"{pin.version}-test")
    cache = agents_cache_dir()
    seeded = cache / f"claude-code-{moved.version}"
    subprocess.run(["cp", "-al", str(cache / f"claude-code-{pin.version}"), str(seeded)], check=True)
    tag = f"forgehand-sandbox-agents:pin-test-{secrets.token_hex(3)}"
    try:
        # The current image under the throwaway tag (a build of its own cost a minute and proved
        # only that a missing tag is built): its labels match, so nothing is built.
        docker_client.images.get(agents_image).tag(tag)
        assert not (await asyncio.to_thread(build_agents_image, tag)).built
        changed = await asyncio.to_thread(build_agents_image, tag, pins={"claude-code": moved})
        assert changed.built
        assert docker_client.images.get(tag).labels["org.forgehand.agent.claude-code"] == moved.version
        assert not (await asyncio.to_thread(build_agents_image, tag, pins={"claude-code": moved})).built
        assert (await asyncio.to_thread(build_agents_image, tag)).built
        assert docker_client.images.get(tag).labels["org.forgehand.agent.claude-code"] == pin.version
    finally:
        docker_client.images.remove(tag, force=True)
        shutil.rmtree(seeded, ignore_errors=True)


async def test_image_contents(agents_sandbox: Sandbox) -> None:
    r = await agents_sandbox.exec(
        [
            "sh",
            "-c",
            "claude --version; codex --version; id -u;"
            f"stat -c '%U %a' /usr/local/bin/claude /usr/local/bin/forgehand-hook /usr/local/bin/forgehand-relay "
            f"/etc/claude-code {MANAGED_SETTINGS_PATH} /usr/local/bin/codex /etc/codex {CODEX_REQUIREMENTS_PATH};"
            f"echo x >> {MANAGED_SETTINGS_PATH} 2>/dev/null || echo settings-unwritable;"
            f"echo x >> {CODEX_REQUIREMENTS_PATH} 2>/dev/null || echo requirements-unwritable;"
            "find / -xdev -perm /6000 -type f 2>/dev/null | wc -l",
        ]
    )
    assert r.exit_code == 0, r
    assert r.stdout.decode().splitlines() == [
        f"{CLAUDE_VERSION} (Claude Code)",
        f"codex-cli {CODEX_VERSION}",
        "1000",
        "root 755",
        "root 755",
        "root 755",
        "root 755",
        "root 644",
        "root 755",
        "root 755",
        "root 644",
        "settings-unwritable",
        "requirements-unwritable",
        "0",
    ]
    shown = await agents_sandbox.exec(["cat", MANAGED_SETTINGS_PATH])
    assert shown.stdout.decode() == MANAGED_SETTINGS
    shown = await agents_sandbox.exec(["cat", CODEX_REQUIREMENTS_PATH])
    assert shown.stdout.decode() == CODEX_REQUIREMENTS


# -- the hook bridge --------------------------------------------------------------------------

PRE_TOOL_USE = {
    "session_id": "s1",
    "hook_event_name": "PreToolUse",
    "tool_name": "Bash",
    "tool_input": {"command": "rm -rf /workspace"},
    "tool_use_id": "toolu_1",
}


async def run_hook(
    sb: Sandbox, token: str | None, *, event: str = "PreToolUse", env: dict[str, str] | None = None
) -> ExecResult:
    body = dict(PRE_TOOL_USE, hook_event_name=event)
    full_env = dict(env or {})
    if token is not None:
        full_env["FORGEHAND_RUN_TOKEN"] = token
    return await sb.exec(
        ["/usr/local/bin/forgehand-hook", "claude", event], stdin=json.dumps(body).encode(), env=full_env, timeout=60
    )


def decision(result: ExecResult) -> tuple[str, str]:
    out = json.loads(result.stdout)
    return out["hookSpecificOutput"]["permissionDecision"], out["hookSpecificOutput"]["permissionDecisionReason"]


async def test_hook_passes_allow_and_deny_through(agents_sandbox: Sandbox, channel_dir: Path) -> None:
    answers = {"Bash": deny("no deleting"), "Read": allow("fine")}

    def hook(call: HookCall) -> Reply:
        return answers[call.body["tool_name"]]

    with FakeChannel(channel_dir, hook=hook) as ch:
        denied = await run_hook(agents_sandbox, ch.token)
        assert denied.exit_code == 0, denied
        assert decision(denied) == ("deny", "no deleting")
        answers["Bash"] = allow("fine")
        allowed = await run_hook(agents_sandbox, ch.token)
        assert allowed.exit_code == 0 and decision(allowed) == ("allow", "fine")
    # The body reached forgehand unchanged, with the run's token, on the agent's event path.
    assert [(c.agent, c.event) for c in ch.hooks] == [("claude", "PreToolUse")] * 2
    assert ch.hooks[0].body == PRE_TOOL_USE
    assert ch.hooks[0].authorization == f"Bearer {ch.token}"


async def test_the_bridge_never_reads_an_openssl_config_the_agent_names(
    agents_sandbox: Sandbox, channel_dir: Path
) -> None:
    # An agent that can shape a hook's environment (Claude Code's user settings `env`) could point
    # OPENSSL_CONF at a config that loads an engine of its own into the bridge. The config here is
    # a FIFO nobody writes: a bridge that loaded OpenSSL would hang opening it, never answering.
    made = await agents_sandbox.exec(["mkfifo", "/tmp/openssl.cnf"])
    assert made.exit_code == 0, made
    with FakeChannel(channel_dir, hook=lambda call: deny("no deleting")) as ch:
        result = await run_hook(agents_sandbox, ch.token, env={"OPENSSL_CONF": "/tmp/openssl.cnf"})
    assert result.exit_code == 0, result
    assert decision(result) == ("deny", "no deleting")


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        (Reply(status=500, body=b'{"error": "boom"}'), "HTTP 500"),
        (reply_json({"error": "no hook handler"}, status=503), "HTTP 503"),
        (Reply(body=b"<html>not json</html>"), "not JSON"),
        (Reply(body=b'["allow"]'), "not a JSON object"),
        (Reply(close=True), "closed without an answer"),
        (Reply(raw=b"SSH-2.0-not-http\r\n\r\n"), "malformed HTTP answer"),
        (Reply(delay=4.0), "no answer within 1 s"),
    ],
)
async def test_every_failure_of_the_answer_denies(
    agents_sandbox: Sandbox, channel_dir: Path, reply: Reply, reason: str
) -> None:
    with FakeChannel(channel_dir, hook=lambda call: reply) as ch:
        result = await run_hook(agents_sandbox, ch.token, env={"FORGEHAND_HOOK_TIMEOUT": "1"})
    assert result.exit_code == 2, result
    verdict, why = decision(result)
    assert verdict == "deny" and why.startswith("forgehand policy unreachable: ") and reason in why
    assert reason in result.stderr.decode()


async def test_no_socket_no_token_or_a_wrong_token_denies(agents_sandbox: Sandbox, channel_dir: Path) -> None:
    nobody = await run_hook(agents_sandbox, "fhr_whatever")  # the channel directory has no socket yet
    assert nobody.exit_code == 2 and decision(nobody)[0] == "deny"
    assert "no socket" in decision(nobody)[1]
    with FakeChannel(channel_dir) as ch:
        missing = await run_hook(agents_sandbox, None)
        wrong = await run_hook(agents_sandbox, "fhr_" + secrets.token_urlsafe(32))
    assert missing.exit_code == 2 and "no run token" in decision(missing)[1]
    assert wrong.exit_code == 2 and "HTTP 401" in decision(wrong)[1]
    assert ch.hooks == [] and ch.refused == 1  # nothing without the token reached a handler


async def test_other_events_block_on_failure_and_pass_answers_through(
    agents_sandbox: Sandbox, channel_dir: Path
) -> None:
    with FakeChannel(channel_dir, hook=lambda call: Reply(status=500)) as ch:
        failed = await run_hook(agents_sandbox, ch.token, event="PostToolUse")
    assert failed.exit_code == 2
    out = json.loads(failed.stdout)
    assert out["decision"] == "block" and out["reason"] == "forgehand policy unreachable: HTTP 500"
    answer = {"decision": "block", "reason": "the output leaked a secret"}
    with FakeChannel(channel_dir, hook=lambda call: reply_json(answer)) as ch:
        passed = await run_hook(agents_sandbox, ch.token, event="PostToolUse")
    assert passed.exit_code == 0 and json.loads(passed.stdout) == answer
    assert ch.hooks[0].event == "PostToolUse"


async def test_the_environment_cannot_point_the_bridge_elsewhere(agents_sandbox: Sandbox, channel_dir: Path) -> None:
    # PYTHONPATH with a json module that would answer "allow", and a longer timeout: both ignored.
    await agents_sandbox.exec(
        [
            "sh",
            "-c",
            "mkdir -p /workspace/evil && printf 'def loads(*a, **k):\\n    return {}\\n' > /workspace/evil/json.py",
        ]
    )
    with FakeChannel(channel_dir, hook=lambda call: Reply(status=500)) as ch:
        result = await run_hook(
            agents_sandbox, ch.token, env={"PYTHONPATH": "/workspace/evil", "FORGEHAND_HOOK_TIMEOUT": "100000"}
        )
    assert result.exit_code == 2 and decision(result) == ("deny", "forgehand policy unreachable: HTTP 500")


# -- the relay --------------------------------------------------------------------------------


class _Echo(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(b"echo:" + data)


async def test_relay_reaches_a_host_unix_socket_from_tcp(agents_sandbox: Sandbox, channel_dir: Path) -> None:
    path = channel_dir / "echo.sock"
    server = _Echo(str(path), _EchoHandler)
    path.chmod(0o666)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        async with agents_sandbox.spawn(
            ["/usr/local/bin/forgehand-relay", "0", "/run/forgehand/echo.sock"], timeout=60
        ) as relay:
            address = (await asyncio.wait_for(anext(relay.stdout_lines()), 20)).decode()
            host, _, port = address.partition(":")
            assert host == "127.0.0.1"
            client = (
                "import socket, sys\n"
                f"s = socket.create_connection(('127.0.0.1', {port}), timeout=10)\n"
                "s.sendall(b'hello')\n"
                "print(s.recv(100).decode())\n"
            )
            result = await agents_sandbox.exec(["python3", "-c", client], timeout=30)
            assert result.exit_code == 0, result
            assert result.stdout.decode().strip() == "echo:hello"
            await relay.kill()
    finally:
        server.shutdown()
        server.server_close()
