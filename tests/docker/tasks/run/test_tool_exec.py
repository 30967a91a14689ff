"""Custom tools against the real engine: each call in a fresh hardened sandbox of its own, inputs
never in a shell string, the timeout, a cancel, the output's tail and redaction, a missing
interpreter, egress only through the proxy, and nothing left behind."""

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker
import pytest
from docker.models.containers import Container

from egress import AllowedHosts, Blocked, RuleSet
from sandbox import SandboxEngine
from sandbox.spec import LABEL_INSTANCE, LABEL_RUN, LABEL_TASK
from tasks.core.egress_config import EgressPlan
from tasks.core.redaction import Redactor
from tasks.run.tool_exec import (
    EVENT_TAIL_BYTES,
    LABEL_TOOL_RUN,
    OUTPUT_TAIL_BYTES,
    ToolCall,
    ToolEgress,
    event_tail,
    execute_tool,
)
from tests.docker.conftest import INSTANCE
from tests.support.waiting import until

pytestmark = pytest.mark.docker

CallFactory = Callable[..., ToolCall]

# What the container's environment may hold besides the tool's own variables: the image's, the
# sandbox's, and what the shell of the exec wrapper sets.
_PLAIN_ENV = {"PATH", "HOME", "USER", "LANG", "HOSTNAME", "PWD", "SHLVL", "_", "OLDPWD"}


@pytest.fixture
def make_call(sandbox_image: str, workspace: Path, request: pytest.FixtureRequest) -> CallFactory:
    def make(script: str, **kw: Any) -> ToolCall:
        base: dict[str, Any] = {
            "tool_run_id": secrets.randbelow(2**31),
            "tool_name": "probe",
            "version": 3,
            "script": script,
            "interpreter": "sh",
            "inputs": {},
            "arg_env": {},
            "timeout_seconds": 60,
            "image": sandbox_image,
            "workspace": workspace,
            "instance": INSTANCE,
            "task": "t-" + request.node.name[:40],
            "run": secrets.token_hex(4),
        }
        base.update(kw)
        return ToolCall(**base)

    return make


def containers_of(client: docker.DockerClient, call: ToolCall) -> list[Container]:
    labels = [f"{LABEL_INSTANCE}={INSTANCE}", f"{LABEL_TOOL_RUN}={call.tool_run_id}"]
    return list(client.containers.list(all=True, filters={"label": labels}))


def assert_left_nothing(client: docker.DockerClient, call: ToolCall, tool_dir: Path) -> None:
    assert containers_of(client, call) == []
    assert not tool_dir.exists()


async def test_inputs_arrive_literally_never_through_a_shell(
    engine: SandboxEngine,
    make_call: CallFactory,
    workspace: Path,
    channel_dir: Path,
    docker_client: docker.DockerClient,
) -> None:
    (workspace / "keep.txt").write_text("still here\n")
    inputs = {"semicolon": "; rm -rf /", "subst": "$(id)", "tick": "`id`"}
    script = (
        'printf "%s\\n" "$FORGEHAND_ARG_SEMICOLON" "$FORGEHAND_ARG_SUBST" "$FORGEHAND_ARG_TICK"\n'
        'cat "$FORGEHAND_TOOL_INPUT_FILE"; echo\n'
        'echo "$FORGEHAND_TOOL_NAME $FORGEHAND_TOOL_VERSION $(pwd)"\n'
        "cat keep.txt\n"
    )
    arg_env = {f"FORGEHAND_ARG_{name.upper()}": value for name, value in inputs.items()}
    call = make_call(script, inputs=inputs, arg_env=arg_env)

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    lines = outcome.output.splitlines()
    assert lines[:3] == ["; rm -rf /", "$(id)", "`id`"], outcome.output
    assert json.loads(lines[3]) == inputs
    assert lines[4:] == ["probe 3 /workspace", "still here"]
    assert (outcome.exit_code, outcome.failure_reason, outcome.timed_out) == (0, None, False)
    assert outcome.duration_ms > 0
    assert (workspace / "keep.txt").read_text() == "still here\n"
    assert_left_nothing(docker_client, call, channel_dir)


_INSPECT = """\
import json, os, socket
try:
    socket.create_connection(("127.0.0.1", 3128), timeout=2).close()
    proxy = "connected"
except OSError as exc:
    proxy = type(exc).__name__
try:
    open("/run/forgehand/extra", "w")
    channel = "writable"
except OSError:
    channel = "read-only"
print(json.dumps({"env": sorted(os.environ), "uid": os.getuid(), "files": sorted(os.listdir("/run/forgehand")),
                  "channel": channel, "proxy": proxy}))
"""


async def test_the_sandbox_holds_the_tool_and_nothing_else(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call(_INSPECT, interpreter="python3", arg_env={"FORGEHAND_ARG_WHO": "me"})

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert outcome.failure_reason is None, outcome.output
    seen = json.loads(outcome.output)
    ours = {"FORGEHAND_ARG_WHO", "FORGEHAND_TOOL_INPUT_FILE", "FORGEHAND_TOOL_NAME", "FORGEHAND_TOOL_VERSION"}
    assert ours <= set(seen["env"]) <= ours | _PLAIN_ENV, seen["env"]
    assert seen["uid"] == 1000
    assert seen["files"] == ["input.json", "script"]
    assert seen["channel"] == "read-only"
    assert seen["proxy"] == "ConnectionRefusedError"  # network none, no relay
    assert_left_nothing(docker_client, call, channel_dir)


async def test_a_timeout_stops_the_tool(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call("echo started\nsleep 30\necho never\n", timeout_seconds=2)
    t0 = time.monotonic()

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert time.monotonic() - t0 < 25, "it returned before the sleep would have ended"
    assert outcome.timed_out and outcome.failure_reason == "timeout"
    assert outcome.output.startswith("started\n") and "never" not in outcome.output
    assert "stopped at its timeout of 2 s" in outcome.output
    assert_left_nothing(docker_client, call, channel_dir)


async def test_a_cancelled_call_removes_its_container(
    engine: SandboxEngine,
    make_call: CallFactory,
    workspace: Path,
    channel_dir: Path,
    docker_client: docker.DockerClient,
) -> None:
    call = make_call("touch /workspace/started\nsleep 60\n")
    running = asyncio.ensure_future(execute_tool(engine, call, tool_dir=channel_dir))
    found = await until(
        lambda: (workspace / "started").exists() and containers_of(docker_client, call),
        timeout=60,
        what="the tool's script to run",
    )
    labels = found[0].labels
    assert (labels[LABEL_TASK], labels[LABEL_RUN]) == (call.task, call.run)
    assert found[0].attrs["HostConfig"]["NetworkMode"] == "none"

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running

    assert_left_nothing(docker_client, call, channel_dir)


async def test_the_output_keeps_its_tail_redacted(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    secret = "sk-test-" + secrets.token_hex(12)
    # All on stdout: stdout and stderr are two pipes, and their bytes may arrive in either order.
    script = f"head -c 1048576 /dev/zero | tr '\\0' x\necho\necho 'the key is {secret}'\n"
    call = make_call(script)

    outcome = await execute_tool(engine, call, tool_dir=channel_dir, redact=Redactor([secret]).redact)

    assert (outcome.exit_code, outcome.failure_reason) == (0, None)
    first, _, body = outcome.output.partition("\n")
    assert first.startswith("[... ") and first.endswith(" bytes cut ...]"), first
    assert len(body.encode()) <= OUTPUT_TAIL_BYTES
    assert body.endswith("x\nthe key is [REDACTED]\n") and secret not in outcome.output
    short = event_tail(outcome.output)
    assert len(short.encode()) <= EVENT_TAIL_BYTES + 40
    assert short.endswith("the key is [REDACTED]\n")
    assert_left_nothing(docker_client, call, channel_dir)


async def test_endless_output_stops_the_tool(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call("cat /dev/zero | tr '\\0' y\n")

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert outcome.failure_reason == "output_limit" and not outcome.timed_out
    assert outcome.output.endswith("[forgehand: the tool was stopped after 16 MiB of output]\n")
    assert_left_nothing(docker_client, call, channel_dir)


async def test_a_non_zero_exit_is_the_tools_failure(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call('echo "bash $BASH_VERSION" >&2\nexit 3\n', interpreter="bash")

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert (outcome.exit_code, outcome.failure_reason, outcome.timed_out) == (3, "exit_status", False)
    assert outcome.output.startswith("bash 5.")
    assert_left_nothing(docker_client, call, channel_dir)


async def test_an_interpreter_the_image_lacks(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call("console.log('hi')\n", interpreter="node")  # the plain sandbox image has no node

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert outcome.failure_reason == "interpreter_missing"
    assert outcome.output.startswith(f"the image {call.image} has no node interpreter"), outcome.output
    assert "hi" not in outcome.output.splitlines()
    assert_left_nothing(docker_client, call, channel_dir)


_PROXY_PROBE = """\
import os, socket
print(os.environ["HTTPS_PROXY"])
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"CONNECT blocked.example:443 HTTP/1.1\\r\\nHost: blocked.example:443\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode())
try:
    socket.create_connection(("192.0.2.1", 443), timeout=2)
    print("direct: connected")
except OSError as exc:
    print("direct:", type(exc).__name__)
"""


async def test_egress_goes_through_the_proxy_only(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    emitted: list[tuple[str, Any]] = []
    notified: list[Blocked] = []

    async def emit(kind: Any, payload: Any) -> None:
        emitted.append((kind, payload))

    async def notify(blocked: Blocked) -> None:
        notified.append(blocked)

    plan = EgressPlan(rules=RuleSet.build([]), allowed_hosts=AllowedHosts.parse(""), presets=(), repo_rules=())
    call = make_call(_PROXY_PROBE, interpreter="python3")

    outcome = await execute_tool(
        engine, call, tool_dir=channel_dir, egress=ToolEgress(plan=plan, emit=emit, notify=notify)
    )

    assert outcome.failure_reason is None, outcome.output
    proxy_url, status, direct = outcome.output.splitlines()
    assert proxy_url == "http://127.0.0.1:3128"
    assert " 403 " in status, status
    assert direct.startswith("direct: ") and "connected" not in direct, direct  # network none
    assert [kind for kind, _ in emitted] == ["egress_blocked"]
    assert emitted[0][1].host == "blocked.example"
    assert [b.host for b in notified] == ["blocked.example"]
    assert_left_nothing(docker_client, call, channel_dir)


async def test_a_sandbox_that_cannot_start(
    engine: SandboxEngine, make_call: CallFactory, channel_dir: Path, docker_client: docker.DockerClient
) -> None:
    call = make_call("echo hi\n", image="forgehand-no-such-image:0")

    outcome = await execute_tool(engine, call, tool_dir=channel_dir)

    assert (outcome.exit_code, outcome.failure_reason) == (None, "sandbox")
    assert "is not on the engine" in outcome.output
    assert_left_nothing(docker_client, call, channel_dir)
