"""The model gateway against scripted providers on 127.0.0.1: the run token is the only way in,
the real key is injected on the host, streams pass through as they arrive, usage and cost are
metered, budgets cut streams cleanly, and upstream trouble reaches the agent typed."""

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

import httpx

from tasks.run.gateway import PriceTable, load_prices, sweep_channels
from tasks.run.gateway.metering import Price
from tests.support.anthropic import ScriptedAnthropic, hang, parse_sse, slow, status, text, tool_use
from tests.support.gateway import ANTHROPIC_KEY, OPENAI_KEY, Recorder, agent_client, open_channel, upstreams
from tests.support.model import ScriptedModel, error, reply
from tests.support.waiting import until

MESSAGES = {"model": "claude-test", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


async def test_missing_revoked_and_foreign_tokens_get_401_and_reach_nothing() -> None:
    with ScriptedAnthropic([text("never")], repeat_last=True) as api:
        ups = upstreams(anthropic_url=api.url)
        async with (
            open_channel(ups, run_id=1) as mine,
            open_channel(ups, run_id=2) as other,
            open_channel(ups, run_id=1) as twin,  # the same ids in another database: another run
        ):
            async with agent_client(mine) as c:
                twins = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": twin.token})
                missing = await c.post("/v1/messages", json=MESSAGES)
                wrong = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": "fhr_" + "x" * 43})
                foreign = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": other.token})
                hook = await c.post(
                    "/hooks/claude/PreToolUse", json={}, headers={"authorization": f"Bearer {other.token}"}
                )
                real = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": ANTHROPIC_KEY})
            revoked_token = mine.token
        # `mine` is closed now: its token is revoked. A new channel of the same run does not take it.
        async with open_channel(ups, run_id=1) as again, agent_client(again) as c:
            revoked = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": revoked_token})
            assert again.token != revoked_token
        for r in (missing, wrong, foreign, twins, hook, real, revoked):
            assert r.status_code == 401, r.text
            assert r.json()["error"]["type"] == "authentication_error"
        assert api.calls == []  # nothing was forwarded


async def test_the_real_key_is_injected_on_the_host_and_streams_pass_through() -> None:
    script = [text("hello there, streaming in pieces", pieces=4, event_delay=0.15)]
    with ScriptedAnthropic(script) as api:
        async with open_channel(upstreams(anthropic_url=api.url), emit=(rec := Recorder())) as ch:
            mode = stat.S_IMODE(os.stat(ch.socket_path).st_mode)
            assert mode == 0o666 and stat.S_IMODE(os.stat(ch.host_dir).st_mode) == 0o755
            assert len(str(ch.container_socket)) < 107 and len(str(ch.socket_path)) < 107
            async with agent_client(ch) as c:
                arrivals: list[tuple[float, bytes]] = []
                headers = {"authorization": f"Bearer {ch.token}", "anthropic-version": "2023-06-01"}
                async with c.stream(
                    "POST", "/v1/messages?beta=true", json={**MESSAGES, "stream": True}, headers=headers
                ) as r:
                    assert r.status_code == 200
                    assert r.headers["content-type"].startswith("text/event-stream")
                    async for piece in r.aiter_raw():
                        arrivals.append((time.monotonic(), piece))
        seen = api.messages[0]
        assert seen.headers["x-api-key"] == ANTHROPIC_KEY and ch.token not in json.dumps(seen.headers)
        assert "authorization" not in seen.headers and seen.query == {"beta": "true"}
        assert seen.headers["anthropic-version"] == "2023-06-01"
        # In pieces, as the upstream sent them: the first arrived well before the upstream finished.
        assert len(arrivals) >= 5
        assert arrivals[0][0] < api.finished_at[0] - 0.5
        body = b"".join(p for _, p in arrivals).decode()
        events = parse_sse(body)
        assert [n for n, _ in events][-1] == "message_stop"
        assert "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta") == script[0].blocks[0].text
        (call,) = rec.model_calls()
        assert call.provider == "anthropic" and call.status == 200 and call.stream
        assert call.input_tokens == 10 and call.output_tokens == 5 and call.ttfb_ms is not None
        assert call.latency_ms >= 600 and call.cost_usd is None  # no price table
        assert ANTHROPIC_KEY not in repr(rec.events)


async def test_openai_chat_completions_get_a_bearer_key_and_usage_with_cost() -> None:
    prices = PriceTable({"scripted": Price(input=3.0, output=15.0)})
    with ScriptedModel([reply("done")]) as model:
        async with (
            open_channel(upstreams(openai_url=model.url), prices=prices, emit=(rec := Recorder())) as ch,
            agent_client(ch) as c,
        ):
            r = await c.post(
                "/v1/chat/completions",
                json={"model": "scripted", "messages": []},
                headers={"authorization": f"Bearer {ch.token}"},
            )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "done"
    assert model.headers[0]["authorization"] == f"Bearer {OPENAI_KEY}"
    (call,) = rec.model_calls()
    assert (call.input_tokens, call.output_tokens) == (10, 5)
    assert call.cost_usd == (10 * 3.0 + 5 * 15.0) / 1_000_000
    assert ch.usage.input_tokens == 10 and ch.cost_micros == 105


async def test_cache_tokens_and_the_price_table_file(tmp_path) -> None:
    table = tmp_path / "prices.toml"
    table.write_text('["claude-*"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\ncache_write = 3.75\n')
    prices = load_prices(str(table))
    script = [text("cached", cache_read_tokens=1000, cache_write_tokens=200, input_tokens=50, output_tokens=20)]
    with ScriptedAnthropic(script) as api:
        async with (
            open_channel(upstreams(anthropic_url=api.url), prices=prices, emit=(rec := Recorder())) as ch,
            agent_client(ch) as c,
        ):
            r = await c.post("/v1/messages", json=MESSAGES, headers={"x-api-key": ch.token})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == "cached"
    (call,) = rec.model_calls()
    assert (call.cache_read_tokens, call.cache_write_tokens, call.input_tokens) == (1000, 200, 50)
    assert ch.cost_micros == round(50 * 3 + 20 * 15 + 1000 * 0.3 + 200 * 3.75)


async def test_budget_reached_mid_stream_cuts_the_stream_cleanly() -> None:
    long_text = "word " * 400  # ~500 tokens estimated from the deltas
    script = [text(long_text, pieces=40, output_tokens=500, event_delay=0.01), text("never")]
    with ScriptedAnthropic(script) as api:
        async with (
            open_channel(upstreams(anthropic_url=api.url), token_budget=100, emit=(rec := Recorder())) as ch,
            agent_client(ch) as c,
        ):
            h = {"x-api-key": ch.token}
            r = await c.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=h)
            assert ch.budget_exhausted.is_set()
            refused = await c.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=h)
    events = parse_sse(r.text)
    names = [n for n, _ in events]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert events[-2][1]["delta"]["stop_reason"] == "max_tokens"
    streamed = "".join(d["delta"]["text"] for n, d in events if n == "content_block_delta")
    assert 0 < len(streamed) < len(long_text)
    assert refused.status_code == 403 and refused.headers["x-forgehand-gateway"] == "budget"
    assert "token budget of 100 exceeded" in refused.json()["error"]["message"]
    assert len(api.messages) == 1  # the refused call never left the host
    calls = rec.model_calls()
    assert "the stream was cut" in calls[0].error and calls[1].status == 403


async def test_upstream_down_slow_429_and_500_reach_the_agent_typed() -> None:
    script = [status(429, retry_after=7), status(500), slow(3.0), hang(), tool_use("Bash", {"command": "ls"})]
    with ScriptedAnthropic(script) as api:
        ups = upstreams(anthropic_url=api.url, timeout=1.0) | upstreams(openai_url="http://127.0.0.1:9/v1")
        async with open_channel(ups, emit=(rec := Recorder())) as ch, agent_client(ch) as c:
            h = {"x-api-key": ch.token}
            t0 = time.monotonic()
            limited = await c.post("/v1/messages", json=MESSAGES, headers=h)
            broken = await c.post("/v1/messages", json=MESSAGES, headers=h)
            slow_one = await c.post("/v1/messages", json=MESSAGES, headers=h)
            hung = await c.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=h)
            ok = await c.post("/v1/messages", json=MESSAGES, headers=h)
            down = await c.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers=h)
            assert time.monotonic() - t0 < 10  # nothing hangs
    assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert broken.status_code == 500
    assert slow_one.status_code == 504 and slow_one.headers["x-forgehand-gateway"] == "timeout"
    assert slow_one.json()["error"]["type"] == "timeout_error"
    assert hung.status_code == 504
    assert ok.status_code == 200 and ok.json()["content"][0]["name"] == "Bash"
    assert down.status_code == 502 and down.headers["x-forgehand-gateway"] == "unreachable"
    assert "unreachable" in down.json()["error"]["message"]
    assert [e.status for e in rec.model_calls()] == [429, 500, 504, 504, 200, 502]


async def test_hook_and_back_channel_bodies_are_capped_below_model_calls() -> None:
    seen: list[str] = []

    async def handler(agent: str, event: str, body: dict) -> dict:
        seen.append(event)
        return {}

    big = b'{"tool_name": "Write", "tool_input": {"content": "' + b"x" * (9 * 1024 * 1024) + b'"}}'
    async with open_channel({}) as ch, agent_client(ch) as c:
        ch.set_hook_handler(handler)
        h = {"authorization": f"Bearer {ch.token}", "content-type": "application/json"}
        hook = await c.post("/hooks/claude/PostToolUse", content=big, headers=h)
        mcp = await c.post("/mcp", content=big, headers={**h, "accept": "application/json, text/event-stream"})
        small = await c.post("/hooks/claude/PostToolUse", json={"tool_name": "Write"}, headers=h)
    assert (hook.status_code, mcp.status_code) == (413, 413)
    assert small.status_code == 200 and seen == ["PostToolUse"]  # the oversize ones reached nothing


async def test_hooks_reach_the_registered_handler() -> None:
    async with open_channel({}) as ch, agent_client(ch) as c:
        h = {"authorization": f"Bearer {ch.token}"}
        none = await c.post("/hooks/claude/PreToolUse", json={"tool_name": "Bash"}, headers=h)
        seen: list[tuple[str, str, dict]] = []

        async def handler(agent: str, event: str, body: dict) -> dict:
            seen.append((agent, event, body))
            await asyncio.sleep(0)  # a handler that awaits (no time passes)
            return {"hookSpecificOutput": {"permissionDecision": "deny", "permissionDecisionReason": "no"}}

        ch.set_hook_handler(handler)
        answered = await c.post("/hooks/claude/PreToolUse", json={"tool_name": "Bash"}, headers=h)
        bad = await c.post("/hooks/claude/PreToolUse", content=b"[1]", headers=h)
        unconfigured = await c.post("/v1/messages", json=MESSAGES, headers=h)
    assert none.status_code == 503 and none.json() == {"error": "no hook handler"}
    assert answered.status_code == 200 and answered.json()["hookSpecificOutput"]["permissionDecision"] == "deny"
    assert seen == [("claude", "PreToolUse", {"tool_name": "Bash"})]
    assert bad.status_code == 400 and unconfigured.status_code == 503


async def test_close_ends_an_open_call_and_removes_the_directory() -> None:
    with ScriptedAnthropic([hang()]) as api:
        async with open_channel(upstreams(anthropic_url=api.url, timeout=60)) as ch:
            client = agent_client(ch)
            pending = asyncio.ensure_future(client.post("/v1/messages", json=MESSAGES, headers={"x-api-key": ch.token}))
            await until(lambda: api.messages, timeout=30, what="the call to be open at the model API")
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 5
        assert not ch.host_dir.exists()
        try:
            r = await asyncio.wait_for(pending, 5)
            assert r.status_code >= 500
        except httpx.HTTPError:
            pass  # the connection was cut: the agent sees a failed call, not a hang
        await client.aclose()


async def test_openai_stream_error_for_unreachable_model_is_json_and_retry_is_passed() -> None:
    with ScriptedModel([error(503), reply("ok")]) as model:
        async with open_channel(upstreams(openai_url=model.url)) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            first = await c.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers=h)
            second = await c.post("/v1/chat/completions", json={"model": "m", "messages": []}, headers=h)
    assert first.status_code == 503 and second.status_code == 200


async def test_the_sweep_removes_dead_channel_directories_only() -> None:
    """Only a directory nobody serves any socket in and that did not change for ten minutes goes:
    another worker's or instance's live run keeps its own, an egress-only one (no gateway.sock)
    included, and so does a run whose directory was just made."""
    root = Path(tempfile.mkdtemp(prefix="fhs-", dir="/tmp"))
    hour_ago = time.time() - 3_600
    try:
        dead = root / "0123456789abcdef"
        dead.mkdir()
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(dead / "gateway.sock"))  # bound, never listening again: a crashed worker's
        sock.close()
        egress = root / "fedcba9876543210"  # an egress-only run's: its proxy's socket, no gateway.sock
        egress.mkdir()
        proxy = socket.socket(socket.AF_UNIX)
        proxy.bind(str(egress / "egress.sock"))
        proxy.listen(1)
        young = root / "00000000000000aa"  # made a moment ago, nothing served yet: a run starting
        young.mkdir()
        async with open_channel({}, root=root) as live:
            for old in (dead, egress, live.host_dir):
                os.utime(old, (hour_ago, hour_ago))
            swept = await asyncio.to_thread(sweep_channels, root, set())
            assert swept == [dead] and not dead.exists(), swept
            assert live.host_dir.exists()  # served by a live process: kept whatever the database says
            assert egress.exists() and young.exists()
        proxy.close()
        assert not live.host_dir.exists()
        assert await asyncio.to_thread(sweep_channels, root, set()) == [egress]
        assert await asyncio.to_thread(sweep_channels, root, set(), now=time.time() + 601) == [young]
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_server_side_tools_that_reach_the_network_are_refused() -> None:
    """The sandbox has no network; the provider's own web search, web fetch, code execution and
    MCP connector would be a way around it (the agent can call the gateway socket itself)."""
    with ScriptedAnthropic([text("fine")], repeat_last=True) as api:
        async with open_channel(upstreams(anthropic_url=api.url)) as ch, agent_client(ch) as c:
            auth = {"x-api-key": ch.token}
            for extra in (
                {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
                {"tools": [{"name": "Read", "input_schema": {}}, {"type": "web_fetch_20250910", "name": "f"}]},
                {"tools": [{"type": "code_execution_20250825", "name": "code_execution"}]},
                {"mcp_servers": [{"type": "url", "url": "https://evil.example/mcp", "name": "x"}]},
                {"container": "container_abc"},
            ):
                r = await c.post("/v1/messages", json={**MESSAGES, **extra}, headers=auth)
                assert r.status_code == 400, (extra, r.text)
                assert "network" in r.json()["error"]["message"]
            assert api.calls == []
            client_tool = {"tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}}]}
            ok = await c.post("/v1/messages", json={**MESSAGES, **client_tool}, headers=auth)
            assert ok.status_code == 200, ok.text
    with ScriptedModel([reply("fine")]) as model:
        async with open_channel(upstreams(openai_url=model.url)) as ch, agent_client(ch) as c:
            body = {"model": "scripted", "messages": [{"role": "user", "content": "hi"}], "web_search_options": {}}
            r = await c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {ch.token}"})
            assert r.status_code == 400 and model.requests == []


async def test_a_channel_root_others_may_write_is_refused(tmp_path: Path) -> None:
    """Whoever may replace a run's directory in the root gets its token and answers its hooks."""
    root = tmp_path / "shared"
    root.mkdir()
    root.chmod(0o777)
    try:
        async with open_channel(upstreams(anthropic_url="http://127.0.0.1:9"), root=root):
            raise AssertionError("the channel started in a world-writable root")
    except PermissionError as exc:
        assert "writable by nobody else" in str(exc)
