"""Runs through the model gateway, end to end: the real engine, a scripted provider on 127.0.0.1.
The real key reaches the provider and never the container (environment, `/proc/*/environ`,
workspace, transcript); usage, cost and the paying key show on the task; a budget reached
mid-stream ends the run `token_budget`; every call is a `model_call` event."""

import asyncio
import json
from typing import Any

import pytest

from forge.core.settings import Settings
from sandbox import CHANNEL_DIR
from tasks.core.states import RunState
from tasks.core.transcript import Notice
from tasks.run import runtimes
from tasks.run.runtimes.base import Outcome, RunContext
from tests.support.anthropic import ScriptedAnthropic, text
from tests.support.model import ScriptedModel, error, reply, tool_call
from tests.support.tasks import SECRET, Env, all_events, seed, serve, task_settings, tree_files, wait_state

pytestmark = pytest.mark.docker

PROBE = (
    "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | sort -u; env; ls -la /run/forgehand; "
    "grep -rl -- sk- /workspace /tmp /home 2>/dev/null; echo probe-done"
)


async def test_builtin_run_meters_usage_and_the_key_never_enters_the_container(
    settings: Settings, sandbox_image: str, tmp_path: Any
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"scripted": {"input": 2.0, "output": 10.0}}))
    script = [
        tool_call("bash", {"command": PROBE}),
        tool_call("write_file", {"path": "out.txt", "content": "written\n"}),
        reply("done"),
    ]
    with ScriptedModel(script) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted", model_prices=str(prices))
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            async with Env(url=url, settings=s, token=token, repo_path=path).client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "probe", "agent": "fixer"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, 1, "awaiting_review", "failed")
                events = await all_events(c, 1)
    assert done["state"] == "awaiting_review", done
    # The real key reached the provider, from the host.
    assert all(h["authorization"] == f"Bearer {SECRET}" for h in model.headers) and len(model.headers) == 3
    probe = next(
        e["payload"]["output"] for e in events if e["kind"] == "tool_result" and e["payload"]["name"] == "bash"
    )
    assert "probe-done" in probe and "gateway.sock" in probe  # the channel is mounted, the probe ran
    assert SECRET not in probe and "[REDACTED]" not in probe  # never there, not merely hidden
    assert SECRET not in json.dumps(events)
    for _mode, blob in tree_files(path, done["head_sha"]).values():
        assert SECRET.encode() not in blob
    # Usage, cost and the paying key on the run and the task.
    run = done["runs"][0]
    assert run["model_key"] == "instance" and run["model_provider"] == "openai"
    assert run["usage"]["input_tokens"] == 30 and run["usage"]["output_tokens"] == 15
    assert run["usage"]["cost_usd"] == pytest.approx((30 * 2.0 + 15 * 10.0) / 1_000_000)
    assert done["usage"] == run["usage"] and done["model_key"] == "instance"
    calls = [e["payload"] for e in events if e["kind"] == "model_call"]
    assert len(calls) == 3 and {c["status"] for c in calls} == {200} and calls[0]["provider"] == "openai"
    assert all(c["model"] == "scripted" and c["latency_ms"] >= 0 for c in calls)


class StreamingProbe:
    """Stands in for a CLI agent: inside the sandbox, it streams one Anthropic call through the
    channel's socket with the run token (as Claude Code does) and reports what arrived."""

    name = "builtin"
    model_provider = "anthropic"

    def needs_model(self) -> bool:
        return True

    async def run(self, ctx: RunContext) -> Outcome:
        assert ctx.channel is not None
        script = (
            "import json, os, socket\n"
            f"s = socket.socket(socket.AF_UNIX); s.connect({CHANNEL_DIR + '/gateway.sock'!r})\n"
            "body = json.dumps({'model': 'claude-test', 'max_tokens': 4000, 'stream': True, 'messages': []})\n"
            "s.sendall(('POST /v1/messages?beta=true HTTP/1.1\\r\\nHost: localhost\\r\\n'\n"
            "  'Authorization: Bearer ' + os.environ['FORGEHAND_RUN_TOKEN'] + '\\r\\n'\n"
            "  'Content-Type: application/json\\r\\nConnection: close\\r\\n'\n"
            "  f'Content-Length: {len(body)}\\r\\n\\r\\n' + body).encode())\n"
            "data = b''\n"
            "while chunk := s.recv(65536):\n"
            "    data += chunk\n"
            "print('status', data.split(b' ')[1].decode(), 'stopped', b'event: message_stop' in data,\n"
            "      'max_tokens', b'max_tokens' in data)\n"
        )
        env = {"FORGEHAND_RUN_TOKEN": ctx.channel.token}
        out = b""
        async with ctx.sandbox.stream(["python3", "-c", script], env=env, timeout=60) as running:
            async for chunk in running:
                out += chunk.data
        await ctx.emit("notice", Notice(text=out.decode(errors="replace")))
        await asyncio.sleep(30)  # an agent that does not notice: the execution ends the run
        return Outcome(status=RunState.SUCCEEDED, summary="should not succeed")


async def test_budget_reached_mid_stream_ends_the_run_token_budget(
    settings: Settings, sandbox_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(runtimes.RUNTIMES, "builtin", StreamingProbe)
    long_text = "token " * 2000
    with ScriptedAnthropic([text(long_text, pieces=200, output_tokens=2000, event_delay=0.005)]) as api:
        s = task_settings(
            settings,
            model_base_url="http://127.0.0.1:9/v1",
            model_name="unused",
            anthropic_base_url=api.url,
            anthropic_api_key="sk-ant-instance-key-0123456789",
            anthropic_model="claude-test",
            task_token_budget=300,
        )
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            async with Env(url=url, settings=s, token=token, repo_path=path).client() as c:
                r = await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "stream", "agent": "fixer"})
                assert r.status_code == 201, r.text
                done = await wait_state(c, 1, "failed", "awaiting_review", timeout=90)
                events = await all_events(c, 1)
    assert done["state"] == "failed" and done["failure_reason"] == "token_budget", done
    assert "token budget of 300 exceeded" in done["error"]
    notes = " ".join(e["payload"]["text"] for e in events if e["kind"] == "notice")
    # The agent got a well-ended stream (message_stop, stop_reason max_tokens), not a hang.
    assert "status 200 stopped True max_tokens True" in notes
    assert api.headers[0]["x-api-key"] == "sk-ant-instance-key-0123456789"
    assert api.messages[0].query == {"beta": "true"}
    (call,) = [e["payload"] for e in events if e["kind"] == "model_call"]
    assert call["provider"] == "anthropic" and "the stream was cut" in call["error"]
    run = done["runs"][0]
    assert run["model_provider"] == "anthropic" and run["model_key"] == "instance"
    assert 0 < run["usage"]["output_tokens"] < 2000


async def test_upstream_errors_are_typed_failures_with_an_event_each(settings: Settings, sandbox_image: str) -> None:
    with ScriptedModel([error(429, retry_after="0"), error(500), error(400)]) as model:
        s = task_settings(settings, model_base_url=model.url, model_name="scripted")
        token, path = await asyncio.to_thread(lambda: asyncio.run(seed(s)))
        for url in serve(s):
            async with Env(url=url, settings=s, token=token, repo_path=path).client() as c:
                await c.post("/api/v1/repos/ana/demo/tasks", json={"goal": "fail", "agent": "fixer"})
                done = await wait_state(c, 1, "failed", "awaiting_review")
                events = await all_events(c, 1)
    assert done["failure_reason"] == "model_error" and "answered 400" in done["error"], done
    assert [e["payload"]["status"] for e in events if e["kind"] == "model_call"] == [429, 500, 400]
