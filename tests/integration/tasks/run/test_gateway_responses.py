"""OpenAI Responses through a real run channel against the scripted Responses server on 127.0.0.1:
the run token is the only way in, the real key is injected on the host, streams pass through as
they arrive, usage (cached input, reasoning) is metered and priced, the budget is enforced up
front and mid-stream, and hosted tools that reach out are refused before anything is sent."""

import asyncio
import json
import time

from tasks.run.gateway import PriceTable
from tasks.run.gateway.metering import Price
from tests.support.gateway import OPENAI_KEY, Recorder, agent_client, open_channel, upstreams
from tests.support.openai_responses import (
    ScriptedResponses,
    custom_tool_call,
    failed,
    function_call,
    parse_sse,
    reasoning,
    slow,
    status,
    text,
    turn,
)
from tests.support.waiting import until

REQUEST = {"model": "scripted", "input": [{"role": "user", "content": "hi"}], "store": False}
PATCH = "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch\n"


async def test_a_streamed_response_passes_through_with_the_real_key_and_is_metered() -> None:
    script = [
        reasoning(
            "considering",
            turn(
                text("let me patch it", pieces=4, input_tokens=1200, cached_tokens=1000, output_tokens=30),
                custom_tool_call("apply_patch", PATCH, "call_p"),
            ),
            reasoning_tokens=12,
        )
    ]
    prices = PriceTable({"scripted": Price(input=2.0, output=8.0, cache_read=0.5)})
    with ScriptedResponses(script) as api:
        rec = Recorder()
        async with open_channel(upstreams(openai_url=api.url), prices=prices, emit=rec) as ch, agent_client(ch) as c:
            pieces: list[bytes] = []
            headers = {"authorization": f"Bearer {ch.token}", "openai-beta": "responses=experimental"}
            async with c.stream("POST", "/v1/responses", json={**REQUEST, "stream": True}, headers=headers) as r:
                assert r.status_code == 200
                assert r.headers["content-type"].startswith("text/event-stream")
                async for piece in r.aiter_raw():
                    pieces.append(piece)
    seen = api.responses[0]
    assert seen.path == "/v1/responses"
    assert seen.headers["authorization"] == f"Bearer {OPENAI_KEY}" and ch.token not in json.dumps(seen.headers)
    assert seen.headers["openai-beta"] == "responses=experimental"
    assert seen.body["input"] == REQUEST["input"]
    events = parse_sse(b"".join(pieces).decode())
    assert events[-1]["type"] == "response.completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert [i["type"] for i in done] == ["reasoning", "message", "custom_tool_call"]
    assert done[2]["input"] == PATCH and done[2]["call_id"] == "call_p"
    (call,) = rec.model_calls()
    assert (call.provider, call.api, call.status, call.stream) == ("openai", "responses", 200, True)
    # input_tokens includes the cached ones; output_tokens includes the reasoning ones.
    assert (call.input_tokens, call.cache_read_tokens, call.output_tokens) == (200, 1000, 42)
    assert call.cost_usd == (200 * 2.0 + 1000 * 0.5 + 42 * 8.0) / 1_000_000
    assert ch.usage.input_tokens == 200 and ch.usage.cache_read_tokens == 1000 and ch.usage.output_tokens == 42
    assert ch.stored.responses == {events[-1]["response"]["id"]}
    assert OPENAI_KEY not in repr(rec.events)


async def test_the_stream_arrives_in_pieces_as_the_upstream_sends_it() -> None:
    script = [text("streaming slowly in pieces", pieces=4, event_delay=0.15)]
    with ScriptedResponses(script) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            arrivals: list[float] = []
            headers = {"authorization": f"Bearer {ch.token}"}
            async with c.stream("POST", "/v1/responses", json={**REQUEST, "stream": True}, headers=headers) as r:
                async for _ in r.aiter_raw():
                    arrivals.append(time.monotonic())
    assert len(arrivals) >= 5
    assert arrivals[0] < api.finished_at[0] - 0.5


async def test_a_json_response_is_metered_and_a_function_call_passes() -> None:
    script = [function_call("exec_command", {"cmd": "ls"}, "call_1", input_tokens=50, cached_tokens=20)]
    with ScriptedResponses(script) as api:
        rec = Recorder()
        async with open_channel(upstreams(openai_url=api.url), emit=rec) as ch, agent_client(ch) as c:
            r = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {ch.token}"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["output"][0]["name"] == "exec_command" and json.loads(body["output"][0]["arguments"]) == {"cmd": "ls"}
    (call,) = rec.model_calls()
    assert (call.api, call.stream, call.input_tokens, call.cache_read_tokens, call.output_tokens) == (
        "responses",
        False,
        30,
        20,
        5,
    )
    assert ch.stored.responses == {body["id"]}


async def test_missing_and_foreign_tokens_get_401_in_openai_shape_and_reach_nothing() -> None:
    with ScriptedResponses([text("never")], repeat_last=True) as api:
        ups = upstreams(openai_url=api.url)
        async with open_channel(ups, run_id=1) as mine, open_channel(ups, run_id=2) as other, agent_client(mine) as c:
            missing = await c.post("/v1/responses", json=REQUEST)
            foreign = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {other.token}"})
            real = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {OPENAI_KEY}"})
    for r in (missing, foreign, real):
        assert r.status_code == 401, r.text
        assert r.json()["error"]["type"] == "authentication_error" and "code" in r.json()["error"]
    assert api.calls == []


async def test_budget_is_refused_up_front_and_a_stream_is_cut_cleanly() -> None:
    long_text = "word " * 400  # ~500 tokens estimated from the deltas
    script = [text(long_text, pieces=40, output_tokens=500, event_delay=0.01), text("never")]
    with ScriptedResponses(script) as api:
        rec = Recorder()
        async with (
            open_channel(upstreams(openai_url=api.url), token_budget=100, emit=rec) as ch,
            agent_client(ch) as c,
        ):
            h = {"authorization": f"Bearer {ch.token}"}
            r = await c.post("/v1/responses", json={**REQUEST, "stream": True}, headers=h)
            assert ch.budget_exhausted.is_set()
            refused = await c.post("/v1/responses", json={**REQUEST, "stream": True}, headers=h)
    events = parse_sse(r.text)
    last = events[-1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["id"] == events[0]["response"]["id"]
    assert last["sequence_number"] == events[-2]["sequence_number"] + 1
    assert last["response"]["usage"]["total_tokens"] >= 100
    kinds = [e["type"] for e in events]
    assert "response.completed" not in kinds and "response.output_item.done" not in kinds  # nothing half-done
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert 0 < len(streamed) < len(long_text)
    assert refused.status_code == 403 and refused.headers["x-forgehand-gateway"] == "budget"
    assert "token budget of 100 exceeded" in refused.json()["error"]["message"]
    assert len(api.responses) == 1
    calls = rec.model_calls()
    assert "the stream was cut" in calls[0].error and calls[0].api == "responses" and calls[1].status == 403


async def test_an_agent_that_hangs_up_before_the_usage_is_charged_its_input() -> None:
    """OpenAI reports usage only at the end: a call the agent abandons after the first delta still
    cost its input at the provider, so the budget is charged the request's size (else a big prompt
    sent again and again, each time cut short, would spend without limit)."""
    script = [text("word " * 200, pieces=50, output_tokens=200, event_delay=0.05), text("never")]
    big = {**REQUEST, "input": [{"role": "user", "content": "x" * 40_000}], "stream": True}  # ~10k tokens
    with ScriptedResponses(script) as api:
        async with open_channel(upstreams(openai_url=api.url), token_budget=5_000) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            async with c.stream("POST", "/v1/responses", json=big, headers=h) as r:
                async for _ in r.aiter_bytes():
                    break  # the first bytes, then the agent is gone
            await until(ch.budget_exhausted.is_set, timeout=10, what="the abandoned call to use up the budget")
            refused = await c.post("/v1/responses", json={**REQUEST, "stream": True}, headers=h)
    assert ch.budget.used >= 10_000
    assert refused.status_code == 403 and refused.headers["x-forgehand-gateway"] == "budget"
    assert len(api.responses) == 1


async def test_hosted_tools_that_reach_out_are_refused_unless_web_search_is_allowed() -> None:
    refused_bodies = [
        {"tools": [{"type": "web_search"}]},
        {"tools": [{"type": "function", "name": "f", "parameters": {}}, {"type": "web_search_preview"}]},
        {"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]},
        {"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]},
        {"tools": [{"type": "computer_use_preview", "display_width": 1, "display_height": 1, "environment": "linux"}]},
        {"tools": [{"type": "image_generation"}]},
        {"tools": [{"type": "mcp", "server_label": "x", "server_url": "https://evil.example/mcp"}]},
        {"tools": [{"type": "mcp", "server_label": "g", "connector_id": "connector_gmail"}]},
        {"background": True},
        {"conversation": "conv_123"},
        {"previous_response_id": "resp_someone_elses"},
    ]
    with ScriptedResponses([text("fine")], repeat_last=True) as api:
        rec = Recorder()
        async with open_channel(upstreams(openai_url=api.url), emit=rec) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            for extra in refused_bodies:
                r = await c.post("/v1/responses", json={**REQUEST, **extra}, headers=h)
                assert r.status_code == 403, (extra, r.text)
                assert r.headers["x-forgehand-gateway"] == "refused"
                error = r.json()["error"]
                assert error["type"] == "permission_error" and "nothing was sent" in error["message"]
            assert api.calls == []
            assert [e.status for e in rec.model_calls()] == [403] * len(refused_bodies)
            assert "web search" in rec.model_calls()[0].error
            tools = {"tools": [{"type": "function", "name": "exec_command", "parameters": {}}, {"type": "custom"}]}
            first = await c.post("/v1/responses", json={**REQUEST, **tools}, headers=h)
            assert first.status_code == 200, first.text
            # A response this run created may be continued.
            follow = await c.post(
                "/v1/responses", json={**REQUEST, "previous_response_id": first.json()["id"]}, headers=h
            )
            assert follow.status_code == 200, follow.text
    with ScriptedResponses([text("searched")]) as api:
        async with open_channel(upstreams(openai_url=api.url), allow_web_search=True) as ch, agent_client(ch) as c:
            r = await c.post(
                "/v1/responses",
                json={**REQUEST, "tools": [{"type": "web_search"}]},
                headers={"authorization": f"Bearer {ch.token}"},
            )
            assert r.status_code == 200 and api.requests[0]["tools"] == [{"type": "web_search"}]


async def test_upstream_failures_reach_the_agent_in_the_responses_shape() -> None:
    script = [status(429, retry_after=4), failed("server_error", "upstream broke", text("partial"))]
    with ScriptedResponses(script) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            limited = await c.post("/v1/responses", json=REQUEST, headers=h)
            broken = await c.post("/v1/responses", json={**REQUEST, "stream": True}, headers=h)
        down_ups = upstreams(openai_url="http://127.0.0.1:9/v1")
        async with open_channel(down_ups, emit=(rec := Recorder())) as ch, agent_client(ch) as c:
            down = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {ch.token}"})
    assert limited.status_code == 429 and limited.headers["retry-after"] == "4"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert parse_sse(broken.text)[-1]["type"] == "response.failed"
    assert down.status_code == 502 and down.headers["x-forgehand-gateway"] == "unreachable"
    assert rec.model_calls()[0].api == "responses"


async def test_a_stream_the_upstream_stops_sending_ends_in_response_failed() -> None:
    script = [text("slow " * 20, pieces=10, event_delay=2.0)]
    with ScriptedResponses(script) as api:
        async with (
            open_channel(upstreams(openai_url=api.url, timeout=0.5)) as ch,
            agent_client(ch) as c,
        ):
            r = await c.post(
                "/v1/responses", json={**REQUEST, "stream": True}, headers={"authorization": f"Bearer {ch.token}"}
            )
    events = parse_sse(r.text)
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"]["code"] == "server_error"
    assert "stopped sending" in events[-1]["response"]["error"]["message"]
    assert events[-1]["sequence_number"] == len(events) - 1


async def test_parallel_calls_cannot_overrun_the_budget_together() -> None:
    """Without a reservation, every call starting while the budget is not used up would be let
    through, and their input (reported only at the end by OpenAI) would add up past the limit.
    Each holds its input by size plus its declared `max_output_tokens`: two fit in 1,000, a third not."""
    big_input = [{"role": "user", "content": "x" * 1600}]  # ~400 tokens by size
    script = [slow(0.8, text("one", input_tokens=450))] * 3
    with ScriptedResponses(script) as api:
        rec = Recorder()
        async with (
            open_channel(upstreams(openai_url=api.url), token_budget=1000, emit=rec) as ch,
            agent_client(ch) as c,
        ):
            h = {"authorization": f"Bearer {ch.token}"}
            body = {**REQUEST, "input": big_input, "max_output_tokens": 50}
            first = asyncio.ensure_future(c.post("/v1/responses", json=body, headers=h))
            await until(lambda: len(api.responses) == 1, timeout=30, what="the first call to reach the API")
            second = asyncio.ensure_future(c.post("/v1/responses", json=body, headers=h))
            await until(lambda: len(api.responses) == 2, timeout=30, what="the second call to reach the API")
            third = await c.post("/v1/responses", json=body, headers=h)
            ok = [await first, await second]
    assert [r.status_code for r in ok] == [200, 200]
    assert third.status_code == 429 and third.headers["x-forgehand-gateway"] == "budget-reserved"
    assert third.headers["retry-after"] == "1" and "in flight" in third.json()["error"]["message"]
    assert third.json()["error"]["code"] == "gateway_budget_reserved"
    assert len(api.responses) == 2  # the third never left the host
    assert ch.budget.used == 2 * 455 and not ch.budget_exhausted.is_set()
    assert sorted(e.status for e in rec.model_calls()) == [200, 200, 429]
