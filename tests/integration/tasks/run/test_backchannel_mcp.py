"""The back-channel's MCP server on a run's gateway socket: only that run's live token gets in
(401 otherwise, never 400, never another run's tools), the Streamable HTTP shape an MCP client
expects (initialize, tools/list, tools/call, ping, notifications; 405 for GET and DELETE), and the
tools' rules: one question, one summary (the first), nothing after the run ended, and no argument
can name another task."""

import asyncio
import json
from typing import Any

import httpx
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from forge.db.engine import Database
from tasks.run.backchannel import ToolRefused, attach, claude_mcp_config, mcp_client_config
from tests.support.backchannel import McpClient, backchannel_for
from tests.support.gateway import agent_client, open_channel
from tests.support.task_world import TASKS, World, build_task_world

pytestmark = pytest.mark.db

INIT = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}


@pytest.fixture
async def world(db: Database, settings: Settings) -> World:
    return await build_task_world(db, settings)


async def start(client: AsyncTestClient[Litestar], world: World, title: str = "Parent") -> dict[str, Any]:
    body = {"goal": "work", "agent": "fixer", "command": "true", "title": title}
    r = await client.post(TASKS, json=body, headers=world.h("ana"))
    assert r.status_code == 201, r.text
    return dict(r.json())


async def test_only_the_runs_live_token_reaches_its_back_channel(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    await start(client, world, "Other")
    mine_bc = await backchannel_for(client.app, db, 1)
    other_bc = await backchannel_for(client.app, db, 2)
    async with (
        open_channel({}, task_id=mine_bc.task_id, run_id=mine_bc.run_id) as mine,
        open_channel({}, task_id=other_bc.task_id, run_id=other_bc.run_id) as other,
    ):
        attach(mine, mine_bc)
        attach(other, other_bc)
        async with agent_client(mine) as http:
            call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "report_summary", "arguments": {"summary": "from run B"}}}  # fmt: skip
            foreign = await McpClient(http, other.token).post(call)  # run B's token on run A's socket
            missing = await http.post("/mcp", json=call)
            malformed = await McpClient(http, "not-a-token").post(call)
            as_key = await http.post("/mcp", json=call, headers={"x-api-key": other.token})
            ok = McpClient(http, mine.token)
            assert (await ok.request("ping"))["result"] == {}
            got = await http.get("/mcp", headers=ok.headers)
            deleted = await http.delete("/mcp", headers=ok.headers)
        revoked = mine.token
    for r in (foreign, missing, malformed, as_key):
        assert r.status_code == 401, r.text
    assert got.status_code == 405 and deleted.status_code == 405
    assert mine_bc.summary is None and other_bc.summary is None  # nothing reached either run
    # After the run ended (its channel closed) its token opens nothing, not even a new channel of it.
    async with open_channel({}, task_id=mine_bc.task_id, run_id=mine_bc.run_id) as again:
        attach(again, mine_bc)
        async with agent_client(again) as http:
            after = await McpClient(http, revoked).post({"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert after.status_code == 401


async def test_an_mcp_client_initializes_lists_and_calls_the_tools(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    await start(client, world)
    await start(client, world, "Someone else's")
    bc = await backchannel_for(client.app, db, 1)
    async with open_channel({}, task_id=bc.task_id, run_id=bc.run_id) as ch, agent_client(ch) as http:
        attach(ch, bc)
        bare = McpClient(http, ch.token)  # no grant: what a shell command holding the token gets
        text, err = await bare.tool("spawn_subtask", {"name": "x", "instructions": "do x"})
        assert err and "policy did not allow" in text
        text, err = await bare.tool("report_summary", {"summary": "not mine to say"})
        assert err and "policy did not allow" in text
        text, err = await bare.tool("report_summary", {"summary": "again"})
        assert err and "policy did not allow" in text
        # Recorded: the first refusal of each tool is a warning notice in the run's transcript.
        notes = [p.text for k, p in bc.emit.events if k == "notice"]  # type: ignore[attr-defined]
        assert len(notes) == 2 and all("no policy decision allowed was refused" in t for t in notes), notes
        assert "spawn_subtask" in notes[0] and "report_summary" in notes[1]
        assert bc.ungranted == {"spawn_subtask": 1, "report_summary": 2}
        mcp = McpClient(http, ch.token, backchannel=bc)
        init = await mcp.request("initialize", INIT)
        assert init["result"]["protocolVersion"] == "2025-06-18"
        assert init["result"]["serverInfo"]["name"] == "forgehand" and "tools" in init["result"]["capabilities"]
        newer = await mcp.request("initialize", {**INIT, "protocolVersion": "2099-01-01"})
        assert newer["result"]["protocolVersion"] == "2025-11-25"  # ours: the client decides whether it can
        note = await mcp.post({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202 and note.content == b""
        tools = {t["name"]: t for t in (await mcp.request("tools/list"))["result"]["tools"]}
        assert set(tools) == {"ask_user", "report_summary", "record_progress", "spawn_subtask"}
        assert tools["ask_user"]["inputSchema"]["required"] == ["question"]
        assert "options" in tools["ask_user"]["inputSchema"]["properties"]
        # Arguments that name another task are ignored: the summary is this run's.
        text, err = await mcp.tool("report_summary", {"summary": "Fixed the parser.", "task": 2, "task_id": 2})
        assert (text, err) == ("summary recorded", False)
        text, err = await mcp.tool("report_summary", {"summary": "Second thoughts."})
        assert err and "already reported" in text
        text, err = await mcp.tool("ask_user", {"question": "Which colour?", "options": ["red", "blue", "red"]})
        assert not err and "Stop here" in text
        text, err = await mcp.tool("ask_user", {"question": "And the size?"})
        assert err and "already waiting" in text
        text, err = await mcp.tool("ask_user", {"question": ""})
        assert err
        unknown = await mcp.request("tools/call", {"name": "delete_repo", "arguments": {}})
        assert unknown["error"]["code"] == -32602
        missing = await mcp.request("resources/list")
        assert missing["error"]["code"] == -32601
        batch = await mcp.post([{"jsonrpc": "2.0", "id": 7, "method": "ping"}, {"jsonrpc": "2.0", "method": "x"}])
        assert batch.status_code == 200 and batch.json() == [{"jsonrpc": "2.0", "id": 7, "result": {}}]
        bad = await mcp.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, **{"mcp-protocol-version": "1999-01-01"})
        assert bad.status_code == 400
        rebinding = await mcp.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, origin="http://evil.example")
        assert rebinding.status_code == 403
        bc.seal()  # the run settles
        text, err = await mcp.tool("report_summary", {"summary": "Too late."})
        assert err and "run has ended" in text
    assert bc.summary == "Fixed the parser."
    assert bc.question is not None and bc.question.text == "Which colour?"
    assert bc.question.options == ["red", "blue"]
    other = await client.get(f"{TASKS}/2", headers=world.h("ana"))
    assert other.json()["summary"] == "" and other.json()["question"] == ""


async def test_a_summary_racing_the_end_of_the_run_is_kept_exactly_once(
    client: AsyncTestClient[Litestar], world: World, db: Database
) -> None:
    """The execution closes the channel, then seals the back-channel, then stores its summary: a
    report arriving meanwhile is either answered "recorded" and kept, or refused and not kept."""
    await start(client, world)
    for delay in (0.0, 0.001, 0.003, 0.01):
        bc = await backchannel_for(client.app, db, 1)
        async with open_channel({}, task_id=bc.task_id, run_id=bc.run_id) as ch:
            attach(ch, bc)
            http = agent_client(ch)
            mcp = McpClient(http, ch.token)
            bc.grant("report_summary", {"summary": f"done {delay}"})
            body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                    "params": {"name": "report_summary", "arguments": {"summary": f"done {delay}"}}}  # fmt: skip
            call = asyncio.ensure_future(mcp.post(body))
            await asyncio.sleep(delay)  # the race itself: the run ends this long after the call left
        bc.seal()
        stored = bc.summary
        try:
            answer = await call
            # 200 with the result, or 401: the token died with the run before the call got in.
            assert answer.status_code in (200, 401), answer.text
            recorded = answer.status_code == 200 and answer.json()["result"]["isError"] is False
        except httpx.TransportError:  # the connection went with the run: the agent heard nothing
            recorded = False
        finally:
            await http.aclose()
        if recorded:
            assert stored == f"done {delay}"  # told "recorded": it is the run's summary
        else:
            assert stored in (None, f"done {delay}")  # never anything else
        with pytest.raises(ToolRefused):  # sealed: whatever comes later is refused, the first stays
            await bc.report_summary("after")
        assert bc.summary == stored


def test_the_client_config_points_at_the_relay_with_the_run_token() -> None:
    class Channel:
        token = "fhr_" + "a" * 43

    found = mcp_client_config(Channel())
    assert found == {
        "name": "forgehand",
        "url": "http://127.0.0.1:4100/mcp",
        "headers": {"Authorization": "Bearer fhr_" + "a" * 43},
    }


def test_claude_codes_config_leaves_the_token_to_its_environment() -> None:
    class Channel:
        token = "fhr_" + "b" * 43

    config = json.loads(claude_mcp_config(Channel()))
    assert config == {
        "mcpServers": {
            "forgehand": {
                "type": "http",
                "url": "http://127.0.0.1:4100/mcp",
                "headers": {"Authorization": "Bearer ${FORGEHAND_RUN_TOKEN}"},
            }
        }
    }
    assert Channel.token not in claude_mcp_config(Channel())  # not on the command line
