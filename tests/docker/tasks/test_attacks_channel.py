"""What a sandbox can make the host do through its run channel, tried from inside a real sandbox:
the real Claude Code CLI runs the attacker's script through its Bash tool (the scripted model
asks it to), against the run's own socket with the run's own token.

- Parallel model calls under a small token budget: however many an agent opens at once, the run
  is billed at most its budget plus one call's maximum (each call in flight holds its declared
  maximum; a whole JSON answer cannot be cut, so only that reservation bounds it).
- Forged `/hooks/*` calls: a PreToolUse for an id the CLI never announced is denied with no
  policy asked; a flood is refused with 429 past the channel's burst and rate, one transcript
  notice, and the API answers others as fast as before.
- Another instance's sweep of the shared channel root leaves a live egress-only run's channel.
"""

import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from tasks.run.gateway import sweep_channels
from tests.support.anthropic import ScriptedAnthropic, Turn, text, tool_use
from tests.support.egress import origin_server
from tests.support.policy import PolicyConsumer, served_with_policy
from tests.support.tasks import Env, all_events, served, task_settings, wait_state

pytestmark = pytest.mark.docker

KEY = "sk-ant-instance-key-channel-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"

# An HTTP connection over the run's socket, for the scripts the agent runs.
UNIX_HTTP = """
import http.client, json, os, socket, sys, threading, time
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(self.timeout)
        self.sock.connect("/run/forgehand/gateway.sock")
env = os.environ
TOKEN = env.get("FORGEHAND_RUN_TOKEN") or env.get("ANTHROPIC_API_KEY") or env.get("ANTHROPIC_AUTH_TOKEN")
counts, lock = {}, threading.Lock()
def post(conn, path, body, tag=""):
    try:
        headers = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        r = conn.getresponse()
        data = r.read()
        key = tag + str(r.status)
        if tag and r.status == 200:
            out = json.loads(data).get("hookSpecificOutput") or {}
            key += ":" + str(out.get("permissionDecision"))
        if r.status == 429:
            try:
                d = json.loads(data)
                e = d.get("error")
                key += ":" + (e.get("code", "") if isinstance(e, dict) else d.get("code", ""))
            except Exception:
                pass
    except Exception as e:
        key = tag + type(e).__name__
        conn.close()
    with lock:
        counts[key] = counts.get(key, 0) + 1
"""

PARALLEL_CALLS = """
STREAM = {stream}
def call(i):
    body = {{"model": "claude-test", "max_tokens": {max_tokens}, "stream": STREAM,
            "messages": [{{"role": "user", "content": "parallel-budget-call " + str(i)}}]}}
    post(Unix("localhost", timeout=120), "/v1/messages", body)
threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
for t in threads: t.start()
for t in threads: t.join()
print("RESULT " + json.dumps(counts))
"""

HOOK_FLOOD = """
N, T, F = {calls}, 8, 2  # the channel serves 16 connections at once, the CLI's own among them
def forge(k):
    conn = Unix("localhost", timeout=60)
    body = {{"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
            "tool_input": {{"command": "echo forged " + str(k)}}, "tool_use_id": "toolu_forged_" + str(k)}}
    post(conn, "/hooks/claude/PreToolUse", body, tag="pre:")
def worker(k):
    conn = Unix("localhost", timeout=60)
    for i in range(k, N, T):
        body = {{"session_id": "s", "hook_event_name": "PostToolUse", "tool_name": "Bash",
                "tool_input": {{"command": "echo flood " + str(i)}}, "tool_use_id": "toolu_flood_" + str(i),
                "tool_response": {{"stdout": "x"}}}}
        post(conn, "/hooks/claude/PostToolUse", body)
t0 = time.time()
threads = [threading.Thread(target=forge, args=(k,)) for k in range(F)]
threads += [threading.Thread(target=worker, args=(k,)) for k in range(T)]
for t in threads: t.start()
for t in threads: t.join()
counts["seconds"] = round(time.time() - t0, 2)
print("RESULT " + json.dumps(counts))
"""


def bash(script: str, id: str) -> Turn:
    command = "python3 - <<'PY'\n" + UNIX_HTTP + script + "PY\n"
    return tool_use("Bash", {"command": command, "description": "attack", "timeout": 300000}, id=id)


def claude_settings(settings: Settings, api: ScriptedAnthropic, **kw: Any) -> Settings:
    return task_settings(
        settings,
        webhooks_allowed_hosts="127.0.0.1",
        anthropic_base_url=api.url,
        anthropic_api_key=KEY,
        anthropic_model="claude-test",
        **kw,
    )


def script_result(events: list[dict[str, Any]]) -> dict[str, Any]:
    for e in events:
        if e["kind"] == "tool_result" and "RESULT {" in str(e["payload"].get("output")):
            line = next(x for x in str(e["payload"]["output"]).splitlines() if x.startswith("RESULT {"))
            return dict(json.loads(line.removeprefix("RESULT ")))
    raise AssertionError(f"the agent's script printed nothing: {[e['payload'] for e in events][-8:]}")


# --- parallel model calls under a small budget ------------------------------------------------

BUDGET = 5_000
MAX_TOKENS = 2_000  # each call's declared maximum; the scripted provider spends all of it, no more


@pytest.mark.parametrize("stream", [False, True], ids=["whole-answers", "streams"])
async def test_parallel_model_calls_stay_within_the_budget_plus_one_calls_maximum(
    settings: Settings, agents_image: str, stream: bool
) -> None:
    """12 calls at once under a 5,000-token budget, each declaring max_tokens 2,000 and answered
    (after a second, so they overlap) with all 2,000 output tokens, as a real provider may. Before
    the reservation counted the declared maximum, all 12 went upstream and whole answers could not
    be cut: 12 x 2,010 tokens billed. The bound checked is the one the gateway promises: the
    budget plus one call's maximum (its input and its max_tokens), because a lone call is admitted
    whatever it declares and a whole answer is counted only when it arrives."""

    def side(body: dict[str, Any]) -> Turn | None:
        if "parallel-budget-call" not in json.dumps(body.get("messages")):
            return None
        answer = text("word " * MAX_TOKENS, input_tokens=10, output_tokens=MAX_TOKENS, pieces=50, event_delay=0.01)
        return msgspec.structs.replace(answer, delay=1.0)

    turns = [bash(PARALLEL_CALLS.format(stream=stream, max_tokens=MAX_TOKENS), "toolu_parallel"), text("done")]
    with ScriptedAnthropic(turns, repeat_last=True, side=side) as api:
        async with served(claude_settings(settings, api, task_token_budget=BUDGET)) as (_env, c):
            r = await c.post(TASKS, json={"goal": "spend", "agent": "fixer", "runtime": "claude-code"})
            assert r.status_code == 201, r.text
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=240)
            events = await all_events(c, 1)
    counts = script_result(events)
    upstream = [m for m in api.requests if "parallel-budget-call" in json.dumps(m.get("messages"))]
    calls = [e["payload"] for e in events if e["kind"] == "model_call"]
    billed = sum(
        p["input_tokens"] + p["output_tokens"] + p["cache_read_tokens"] + p["cache_write_tokens"] for p in calls
    )
    one_call_max = max(len(json.dumps(m)) for m in upstream) // 4 + MAX_TOKENS
    assert billed <= BUDGET + one_call_max, (billed, counts, done["state"])
    # Turned away before they left the host, in the provider's shape the CLI reports.
    assert counts.get("429:gateway_budget_reserved", 0) >= 12 - len(upstream), counts
    assert len(upstream) < 12, counts
    run = done["runs"][0]
    assert sum(run["usage"][k] for k in ("input_tokens", "output_tokens")) <= BUDGET + one_call_max


# --- a flood of forged hook calls -------------------------------------------------------------

FLOOD = 2_000
BURST, RATE = 100, 10  # the channel's defaults (settings run_channel_call_burst, _rate)
REPO_TASKS = "/api/v1/repos/ana/demo/tasks"


def forged(dispatch: dict[str, Any]) -> bool:
    return str(dispatch.get("data", {}).get("tool_use_id", "")).startswith(("toolu_forged_", "toolu_flood_"))


async def latencies(c: httpx.AsyncClient, n: int = 15) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await c.get(REPO_TASKS)
        assert r.status_code == 200
        out.append(time.perf_counter() - t0)
    return out


def limit_noted(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["kind"] == "notice" and "hook and back-channel calls" in e["payload"]["text"]]


@pytest.mark.serial  # a latency ratio: another test's load beside it would move the ratio, not the product
def test_a_flood_of_forged_hook_calls_is_refused_and_the_api_stays_fast(settings: Settings, agents_image: str) -> None:
    """Forged hook calls from a process in the sandbox. Before the channel checked and limited
    them, each forged PreToolUse was dispatched to the policy endpoint and written to the
    transcript (4,484 in 40 s in the report) and the API slowed to 1.1 s for everyone. Now:
    - 2 forged PreToolUse calls for ids the CLI never showed in its stream are denied once the
      announcement wait passes, and no policy endpoint is asked about them;
    - a flood of 2,000 hook calls (8 connections, as fast as the channel answers) gets 429
      `run_channel_limited` past the burst and the rate (defaults: 100, 10 a second); none is
      dispatched, the transcript stays within what the limit lets through, and the limit is
      noted once;
    - another client's requests answer within a few times their speed before the flood (medians
      of 15, a ratio, not a time), measured once the limit is reached, while the flood goes on:
      refusals (paused, answered 429) must not become the new load."""
    consumer = PolicyConsumer()
    turns = [bash(HOOK_FLOOD.format(calls=FLOOD), "toolu_flood"), text("done")]
    with ScriptedAnthropic(turns, repeat_last=True) as api:
        s = claude_settings(settings, api)

        async def check(env: Env) -> tuple[dict[str, Any], list[dict[str, Any]], list[float], list[float]]:
            async with env.client() as c:
                before = await latencies(c)
                r = await c.post(TASKS, json={"goal": "flood", "agent": "fixer", "runtime": "claude-code"})
                assert r.status_code == 201, r.text
                deadline = time.monotonic() + 180
                # Measured once the channel refuses the flood, while it goes on.
                while not limit_noted(await all_events(c, 1)):
                    assert time.monotonic() < deadline, "the flood never reached the channel's limit"
                    await asyncio.sleep(0.2)
                during = await latencies(c)
                done = await wait_state(c, 1, "awaiting_review", "failed", timeout=300)
                return done, await all_events(c, 1), before, during

        for env in served_with_policy(s, consumer, ["pre_tool_use"]):
            done, events, before, during = asyncio.run(check(env))
    counts = script_result(events)
    assert counts.get("pre:200:deny") == 2, counts  # the unannounced ids: denied, nobody asked
    let_through = counts.get("200", 0) + counts.get("400", 0)
    refused = counts.get("429:run_channel_limited", 0)
    assert let_through <= BURST + RATE * counts["seconds"] + 10, counts  # the burst and the rate
    assert refused >= FLOOD - let_through - 5, counts
    assert [b for b in consumer.seen if forged(b)] == [], counts
    assert len(limit_noted(events)) == 1, limit_noted(events)
    assert len(events) <= 2 * let_through + 200, (len(events), counts)
    ratio = statistics.median(during) / statistics.median(before)
    assert ratio < 5, (ratio, before, during)
    assert done["state"] in ("awaiting_review", "failed")


# --- another instance's sweep -----------------------------------------------------------------

WAIT_THEN_FETCH = (
    "curl -sS --max-time 20 -o first.txt http://127.0.0.1:{port}/file; "
    "for i in $(seq 1 150); do curl -sS --max-time 5 http://127.0.0.1:{port}/go 2>/dev/null | grep -q yes && break; "
    "sleep 0.2; done; "
    "curl -sS --max-time 20 -o second.txt http://127.0.0.1:{port}/file; true"
)


async def test_another_instances_sweep_leaves_a_live_egress_only_runs_channel(
    settings: Settings, sandbox_image: str
) -> None:
    """Two instances share one channel root (the default one is shared by every instance on the
    host; a root of this test's stands in for it). Instance A runs a task with egress and no model
    (its channel directory holds the egress proxy's socket only); instance B starts, and its
    worker sweeps as it does at start. The sweep used to probe only gateway.sock, so it removed
    A's directory and A's egress died: every later request reset."""
    root = Path(tempfile.mkdtemp(prefix="fhx-", dir="/tmp"))
    a = msgspec.structs.replace(settings, run_channel_dir=str(root), egress_allowed_hosts="127.0.0.1")
    b = msgspec.structs.replace(a, instance_id=a.instance_id + "-b")
    files = {"/file": b"from the index\n", "/go": b"not yet\n"}
    with origin_server(files) as index:
        async with served(a) as (_env, c):
            egress = {"mode": "allow-list", "rules": [f"127.0.0.1:{index.port}"]}
            assert (await c.put("/api/v1/repos/ana/demo/task-settings", json={"egress": egress})).status_code == 200
            command = WAIT_THEN_FETCH.format(port=index.port)
            body = {"goal": "fetch", "agent": "fixer", "runtime": "command", "command": command}
            assert (await c.post(TASKS, json=body)).status_code == 201
            deadline = time.monotonic() + 120
            while not any(path == "/go" for _, path, _ in index.requests):
                assert time.monotonic() < deadline, "the run never reached its egress"
                await asyncio.sleep(0.1)
            [sock] = list(root.rglob("egress.sock"))
            assert not (sock.parent / "gateway.sock").exists()  # an egress-only run
            # B's worker at start: its own channels, and what earlier versions left in the root.
            for swept_root in (b.effective_run_channel_dir, b.run_channel_root):
                await asyncio.to_thread(sweep_channels, swept_root, set())
            assert sock.exists(), "another instance's sweep removed a live run's channel"
            files["/go"] = b"yes\n"
            done = await wait_state(c, 1, "awaiting_review", "failed", timeout=120)
    assert done["state"] == "awaiting_review", done
    second = [path for _, path, _ in index.requests].count("/file")
    assert second == 2, index.requests  # the egress still worked after the sweep
