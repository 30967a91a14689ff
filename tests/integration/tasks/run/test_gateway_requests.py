"""What the gateway forwards of an agent's request (review 5, findings 12 and 13), through a real
run channel against the scripted servers on 127.0.0.1: the model is the run's unless the price
table prices the asked one no higher, `service_tier` never reaches the provider, the provider gets
exactly the keys the checks read (duplicates included), and Responses requests that name stored
state the run did not create, a stored prompt or a background run are refused before anything is sent."""

import json
from typing import Any

import httpx

from tasks.run.gateway import PriceTable, Upstream
from tasks.run.gateway.metering import Price
from tests.support.anthropic import ScriptedAnthropic
from tests.support.anthropic import text as claude_text
from tests.support.gateway import Recorder, agent_client, open_channel, upstreams
from tests.support.openai_responses import ScriptedResponses, parse_sse, text

MESSAGES = {"max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}
INPUT = [{"role": "user", "content": "hi"}]
PRICES = PriceTable(
    {
        "claude-test": Price(input=3.0, output=15.0),  # the run's configured model (tests/support/gateway.py)
        "claude-haiku-5-5": Price(input=1.0, output=5.0),  # what Claude Code's subagents ask for
        "claude-haiku-*": Price(input=1.0, output=5.0),
        "claude-t*": Price(input=3.0, output=15.0),  # a family entry, for metering only
        "claude-opus-*": Price(input=15.0, output=75.0),
        "claude-cheap-writes": Price(input=1.0, output=5.0, cache_write=30.0),
    }
)


def claude(token: str) -> dict[str, str]:
    return {"x-api-key": token, "anthropic-version": "2023-06-01", "content-type": "application/json"}


def openai(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


async def test_the_model_is_the_runs_unless_priced_no_higher_and_the_service_tier_is_dropped() -> None:
    asked = ["claude-opus-9", "claude-haiku-5-5", "claude-test", "claude-cheap-writes", "claude-unpriced", ""]
    asked += ["claude-haiku-9", "claude-test-pro"]
    with ScriptedAnthropic([claude_text("ok")], repeat_last=True) as api:
        rec = Recorder()
        async with open_channel(upstreams(anthropic_url=api.url), prices=PRICES, emit=rec) as ch, agent_client(ch) as c:
            for model in asked:
                body = {**MESSAGES, "model": model, "stream": True, "service_tier": "priority", "speed": "fast"}
                r = await c.post("/v1/messages", json=body, headers=claude(ch.token))
                assert r.status_code == 200
    seen = [call.body for call in api.scripted]
    assert [b["model"] for b in seen] == [
        "claude-test",  # 5x the configured model's price: replaced
        "claude-haiku-5-5",  # cheaper per token of every kind: as asked (Claude Code's subagents)
        "claude-test",
        "claude-test",  # cheaper input and output, but dearer cache writes
        "claude-test",  # no price to compare: replaced
        "claude-test",  # no model named: the run's
        # Priced only by a `prefix*` family entry: replaced, even when the family's price is not
        # above the configured model's (a family's priciest member would pass as its cheapest).
        "claude-test",
        "claude-test",
    ]
    assert all("service_tier" not in b and "speed" not in b for b in seen)
    assert [m.model for m in rec.model_calls()] == [b["model"] for b in seen]


async def test_without_a_price_table_every_other_model_is_replaced() -> None:
    with ScriptedResponses([text("ok")], repeat_last=True) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            for model in ("gpt-5.5-pro", "scripted"):
                body = {"model": model, "input": INPUT, "service_tier": "priority", "store": False}
                assert (await c.post("/v1/responses", json=body, headers=openai(ch.token))).status_code == 200
            chat = {"model": "gpt-5.5-pro", "messages": INPUT, "service_tier": "flex"}
            await c.post("/v1/chat/completions", json=chat, headers=openai(ch.token))
    assert [(call.body["model"], "service_tier" in call.body) for call in api.scripted] == [
        ("scripted", False),
        ("scripted", False),
    ]
    chats = api.posts("/v1/chat/completions")
    assert [(call.body["model"], "service_tier" in call.body) for call in chats] == [("scripted", False)]


async def test_with_no_configured_model_the_price_table_lists_what_may_be_used() -> None:
    with ScriptedAnthropic([claude_text("ok")], repeat_last=True) as api:
        ups = {"anthropic": Upstream(provider="anthropic", base_url=api.url, api_key="sk-x", model="", timeout=10.0)}
        async with open_channel(ups, prices=PRICES) as ch, agent_client(ch) as c:
            refused = await c.post("/v1/messages", json={**MESSAGES, "model": "claude-x"}, headers=claude(ch.token))
            ok = await c.post("/v1/messages", json={**MESSAGES, "model": "claude-opus-9"}, headers=claude(ch.token))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "gateway_model_refused"
    assert ok.status_code == 200 and [call.body["model"] for call in api.scripted] == ["claude-opus-9"]


def raw(*pairs: tuple[str, Any]) -> bytes:
    """A JSON object with keys in this order, repeats kept (json.dumps cannot write those)."""
    return b"{" + b",".join(json.dumps(k).encode() + b":" + json.dumps(v).encode() for k, v in pairs) + b"}"


async def test_the_provider_gets_the_keys_the_checks_read_and_no_duplicates() -> None:
    web = [{"type": "web_search"}]
    with ScriptedResponses([text("ok")], repeat_last=True) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            h = openai(ch.token)
            # last one wins for the checks, and only it is forwarded (a first-wins parser sees the same)
            head = [("model", "scripted"), ("input", INPUT)]
            sent = await c.post("/v1/responses", content=raw(*head, ("tools", web), ("tools", [])), headers=h)
            refused = await c.post("/v1/responses", content=raw(*head, ("tools", []), ("tools", web)), headers=h)
            # inside a tool and an input item too (the levels the checks read)
            tool = b'{"model":"scripted","input":[],"tools":[{"type":"web_search","type":"function","name":"f"}]}'
            item = b'{"model":"scripted","input":[{"type":"item_reference","id":"x","type":"message",'
            item += b'"role":"user","content":"hi"}]}'
            nested = [await c.post("/v1/responses", content=body, headers=h) for body in (tool, item)]
            bad = await c.post("/v1/responses", content=b'{"model":"scripted","tools":{"type":"mcp"}}', headers=h)
    assert sent.status_code == 200 and refused.status_code == 403
    assert refused.json()["error"]["code"] == "gateway_refused"
    assert [r.status_code for r in nested] == [200, 200]
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "gateway_bad_request"
    first, second, third = api.scripted
    assert first.body["tools"] == [] and b"web_search" not in first.raw and first.raw.count(b'"tools"') == 1
    assert second.body["tools"] == [{"type": "function", "name": "f"}] and b"web_search" not in second.raw
    assert third.body["input"][0]["type"] == "message" and b"item_reference" not in third.raw


async def test_background_stored_prompts_and_foreign_item_references_are_refused() -> None:
    with ScriptedResponses([text("first")], repeat_last=True) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            h = openai(ch.token)

            async def post(**extra: Any) -> httpx.Response:
                return await c.post("/v1/responses", json={"model": "scripted", "input": INPUT, **extra}, headers=h)

            refused = [await post(background=value) for value in (True, "true", 1, {"on": True})] + [
                await post(prompt={"id": "pmpt_1", "version": "2"})
            ]
            passed = [await post(background=False), await post(background=None)]
            foreign = await post(input=[{"type": "item_reference", "id": "msg_not_ours"}])
            # a reference's type is optional in the API: an item with an id and no type is one too
            untyped = [await post(input=[{"id": "msg_not_ours"}]), await post(input=[{"type": None, "id": "msg_x"}])]
            odd_previous = await post(previous_response_id=["resp_1"])
            streamed = {"model": "scripted", "input": INPUT, "stream": True}
            async with c.stream("POST", "/v1/responses", json=streamed, headers=h) as r:
                events = parse_sse((await r.aread()).decode())
            made = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
            ours = await post(input=[*INPUT, {"type": "item_reference", "id": made[0]}])
    assert [r.status_code for r in refused] == [403] * 5
    assert {r.json()["error"]["code"] for r in refused} == {"gateway_refused"}
    assert "background" in refused[1].json()["error"]["message"]
    assert "prompt" in refused[4].json()["error"]["message"]
    assert [r.status_code for r in passed] == [200, 200]
    assert foreign.status_code == 403 and "item_reference" in foreign.json()["error"]["message"]
    assert [r.status_code for r in untyped] == [403, 403]
    assert odd_previous.status_code == 403 and "previous_response_id" in odd_previous.json()["error"]["message"]
    assert made and ours.status_code == 200
    # what was refused never reached the provider: two passed, one stream, the own reference
    assert len(api.scripted) == 4


async def test_a_messages_body_with_repeated_keys_goes_upstream_as_checked() -> None:
    server_tool = [{"type": "web_search_20250305", "name": "web_search"}]
    connector = [{"type": "url", "url": "https://mcp.example.com/sse", "name": "x"}]
    base = [("model", "claude-test"), ("max_tokens", 64), ("messages", MESSAGES["messages"])]
    with ScriptedAnthropic([claude_text("ok")], repeat_last=True) as api:
        async with open_channel(upstreams(anthropic_url=api.url)) as ch, agent_client(ch) as c:
            h = claude(ch.token)
            sent = await c.post(
                "/v1/messages",
                content=raw(
                    *base, ("tools", server_tool), ("mcp_servers", connector), ("tools", []), ("mcp_servers", None)
                ),
                headers=h,
            )
            refused = await c.post("/v1/messages", content=raw(*base, ("tools", []), ("tools", server_tool)), headers=h)
    assert sent.status_code == 200
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "gateway_network_tool"
    (seen,) = api.scripted
    assert seen.body["tools"] == [] and seen.body["mcp_servers"] is None
    assert b"web_search" not in seen.raw and b"mcp.example.com" not in seen.raw


async def test_premium_anthropic_betas_never_reach_the_provider() -> None:
    betas = "fast-mode-2026-02-01, interleaved-thinking-2025-05-14,CONTEXT-1M-2025-08-07"
    with ScriptedAnthropic([claude_text("ok")], repeat_last=True) as api:
        async with open_channel(upstreams(anthropic_url=api.url)) as ch, agent_client(ch) as c:
            h = claude(ch.token)
            mixed = await c.post("/v1/messages", json=MESSAGES, headers={**h, "anthropic-beta": betas})
            only = await c.post("/v1/messages", json=MESSAGES, headers={**h, "anthropic-beta": "fast-mode-2026-02-01"})
    assert (mixed.status_code, only.status_code) == (200, 200)
    # Fast mode and the 1M context window bill the same tokens at a premium: dropped, the rest kept.
    assert [h.get("anthropic-beta") for h in api.headers] == ["interleaved-thinking-2025-05-14", None]
