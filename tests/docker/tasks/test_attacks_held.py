"""The attempts against the run channel, the gateway and the back-channel that the current code
stops, kept stopped: each played from inside a real sandbox by the real Claude Code CLI, whose
scripted model makes it run the attacker's script through its Bash tool (python against the run's
socket `/run/forgehand/gateway.sock` and the gateway relay on 127.0.0.1:4100) or call a tool
itself.

- Back-channel tools without a grant: a tool the policy denied, a grant already used, a tool never
  asked for, called through the MCP endpoint from a shell: refused, recorded, nothing done.
- Tokens of an ended run (read from a file the earlier run left in the workspace) and of another
  live run (handed over by the model) on this run's gateway, hooks and back-channel: 401.
- Approval replay: an approved call runs once; the same call again asks the policy again, and a
  forged hook call for the approved call's id gets no decision.
- Hook paths that climb out of /hooks, hook calls for another agent or another session, oversized
  bodies, calls for a provider the run does not speak, Host and request-target overrides.

One served forge and one scripted model for the module (each test's task has its own tag in its
goal, and the model's router answers each conversation from its own script)."""

import asyncio
import json
import re
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings, load_settings, prepare_data_dir
from tests.support import databases
from tests.support.anthropic import ScriptedAnthropic, Turn, text, tool_use
from tests.support.model import ScriptedModel, reply
from tests.support.policy import PolicyConsumer, make_hook_token
from tests.support.tasks import Env, all_events, seed, serve, task_settings, tree_files, wait_task
from tests.support.waiting import until

pytestmark = pytest.mark.docker

KEY = "sk-ant-instance-key-held-0123456789"
TASKS = "/api/v1/repos/ana/demo/tasks"
TOKEN_RE = re.compile(r"fhr_[A-Za-z0-9_-]{43}")


# --- the model: one script per tagged conversation ----------------------------------------------


class Step(msgspec.Struct, frozen=True):
    """One tool call of a script; `turn` may be made when it is asked for (it may wait)."""

    id: str
    turn: Turn | Callable[[], Turn]
    stop_after: bool = False  # its result ends the run's turn: the model answers "done"


def _results(message: dict[str, Any]) -> set[str]:
    content = message.get("content")
    blocks = content if isinstance(content, list) else []
    return {str(b.get("tool_use_id")) for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"}


class Router:
    """The scripted model's `side`: a conversation whose first message holds a tag gets the first
    step of that tag's script that has no result yet (stateless: a retried request gets the same
    answer), "done" after a `stop_after` step's result and once all steps have one."""

    def __init__(self) -> None:
        self.scripts: dict[str, list[Step]] = {}
        self.listeners: dict[str, Callable[[list[dict[str, Any]]], None]] = {}

    def add(self, tag: str, steps: list[Step], listen: Callable[[list[dict[str, Any]]], None] | None = None) -> None:
        self.scripts[tag] = steps
        if listen is not None:
            self.listeners[tag] = listen

    def __call__(self, body: dict[str, Any]) -> Turn | None:
        messages = body.get("messages") or []
        first = json.dumps(messages[0]) if messages else ""
        tag = next((t for t in self.scripts if t in first), None)
        if tag is None:
            return None
        if tag in self.listeners:
            self.listeners[tag](messages)
        answered = set().union(*(_results(m) for m in messages if m.get("role") == "user"))
        latest = _results(messages[-1]) if messages[-1].get("role") == "user" else set()
        steps = self.scripts[tag]
        if any(s.stop_after and s.id in latest for s in steps):
            return text("done")
        for step in steps:
            if step.id not in answered:
                return step.turn() if callable(step.turn) else step.turn
        return text("done")


# --- the served forge -------------------------------------------------------------------------


class Consumer(PolicyConsumer):
    """The repository's policy: denies the back-channel's spawn_subtask, asks a person about any
    call that mentions `needs-approval`, allows the rest."""

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body.get("type") != "pre_tool_use":
            return 200, None
        data = body["data"]
        if str(data["tool_name"]).endswith("spawn_subtask"):
            return 200, {"permission": {"decision": "deny", "reason": "no subtasks here"}}
        if "needs-approval" in json.dumps(data["tool_input"]):
            return 200, {"permission": {"decision": "ask", "reason": "a person decides"}}
        return 200, None

    def pre_tool_use(self) -> list[dict[str, Any]]:
        return [b["data"] for b in self.seen if b.get("type") == "pre_tool_use"]


class World(msgspec.Struct):
    env: Env
    api: ScriptedAnthropic
    openai: ScriptedModel  # configured for the instance; a claude-code run must never reach it
    router: Router
    consumer: Consumer

    def drive(self, fn: Callable[[httpx.AsyncClient], Awaitable[Any]]) -> Any:
        async def go() -> Any:
            async with self.env.client() as c:
                return await fn(c)

        return asyncio.run(go())


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, agents_image: str) -> Iterator[World]:
    base = tmp_path_factory.mktemp("held")
    db_url = databases.sqlite_copy(databases.sqlite_template(tmp_path_factory.getbasetemp()), base / "forgehand.db")
    plain = load_settings(
        environ={}, data_dir=base / "data", database_url=db_url, base_url="http://testserver.local",
        log_level="warning", run_worker=False, seed_demo=False,
    )  # fmt: skip
    router, consumer = Router(), Consumer()
    with (
        ScriptedAnthropic([text("default")], repeat_last=True, side=router) as api,
        ScriptedModel([reply("never")]) as openai,
    ):
        s: Settings = task_settings(
            prepare_data_dir(plain), webhooks_allowed_hosts="127.0.0.1", anthropic_base_url=api.url,
            anthropic_api_key=KEY, anthropic_model="claude-test", model_base_url=openai.url, model_name="gpt-test",
            task_concurrency=3, task_repo_concurrency=3,
        )  # fmt: skip
        token, path = asyncio.run(seed(s))
        admin = asyncio.run(make_hook_token(s))
        for url in serve(s):
            hook = {"url": consumer.url, "kind": "policy", "events": ["pre_tool_use"], "failure_policy": "closed"}
            auth = {"Authorization": f"Bearer {admin}"}
            r = httpx.post(f"{url}/api/v1/repos/ana/demo/hooks", json=hook, headers=auth, timeout=60)
            assert r.status_code == 201, r.text
            env = Env(url=url, settings=s, token=token, repo_path=path)
            yield World(env=env, api=api, openai=openai, router=router, consumer=consumer)


async def start(c: httpx.AsyncClient, goal: str) -> int:
    r = await c.post(TASKS, json={"goal": goal, "agent": "fixer", "runtime": "claude-code"})
    assert r.status_code == 201, r.text
    return int(r.json()["number"])


async def wait_for(
    c: httpx.AsyncClient, number: int, ok: Callable[[dict[str, Any]], bool], timeout: float = 240
) -> dict[str, Any]:
    """The task once `ok` holds (a settled state that is not the one wanted fails at once)."""

    def there(task: dict[str, Any]) -> bool:
        if ok(task):
            return True
        assert task["state"] != "failed", task
        return False

    return await wait_task(c, number, there, what=f"task {number} to get there", timeout=timeout)


def resting(state: str, runs: int) -> Callable[[dict[str, Any]], bool]:
    return lambda t: t["state"] == state and len(t["runs"]) == runs and t["runs"][-1]["state"] != "running"


def script_result(events: list[dict[str, Any]], call_id: str) -> dict[str, Any]:
    for e in events:
        if e["kind"] == "tool_result" and e["payload"]["id"] == call_id:
            lines = [x for x in str(e["payload"]["output"]).splitlines() if x.startswith("RESULT {")]
            assert lines, e["payload"]
            return dict(json.loads(lines[-1].removeprefix("RESULT ")))
    raise AssertionError(f"no result for {call_id}: {[e['payload'] for e in events][-8:]}")


def direct_calls(api: ScriptedAnthropic, marker: str) -> list[Any]:
    """The model calls the agent's script made itself (its marker the first message), not the CLI's
    conversation (which carries the script's text)."""
    out = []
    for m in api.calls:
        messages = m.body.get("messages")
        first = messages[0].get("content") if isinstance(messages, list) and messages else None
        if isinstance(first, str) and first.startswith(marker):
            out.append(m)
    return out


def model_saw(api: ScriptedAnthropic, marker: str) -> bool:
    return bool(direct_calls(api, marker))


# --- the attacker's script --------------------------------------------------------------------

# Raw HTTP/1.1 over the run's socket or the gateway relay: the request target and every header
# exactly as written (no client normalises a path or fills in a Host).
ATTACK_LIB = r"""
import json, os, socket
TOKEN = os.environ["FORGEHAND_RUN_TOKEN"]
def call(target, body=b"", headers=None, via="socket", method="POST"):
    if not isinstance(body, bytes):
        body = json.dumps(body).encode()
    if via == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(60)
        s.connect("/run/forgehand/gateway.sock")
    else:
        s = socket.create_connection(("127.0.0.1", 4100), timeout=60)
    h = {"Host": "localhost", "Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "Connection": "close", "Content-Length": str(len(body))}
    h.update(headers or {})
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items()) + "\r\n"
    out = b""
    try:
        s.sendall(head.encode() + body)
    except OSError:
        pass  # answered (and closed) before the whole body went
    try:
        while chunk := s.recv(65536):
            out += chunk
    except OSError as e:
        if not out:
            return {"status": type(e).__name__, "body": ""}
    s.close()
    status_line, _, rest = out.partition(b"\r\n\r\n")
    status = int(status_line.split()[1]) if status_line else 0
    return {"status": status, "body": rest.decode("utf-8", "replace")[-400:]}
def bearer(token):
    return {"Authorization": "Bearer " + token}
def mcp(tool, args, token=None, via="relay"):
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": args}}
    return call("/mcp", body, bearer(token or TOKEN), via=via)
def model_body(marker, **kw):
    return {"model": "claude-test", "max_tokens": 16, "messages": [{"role": "user", "content": marker}], **kw}
out = {}
"""


def bash(script: str, id: str) -> Turn:
    command = "python3 - <<'PY'\n" + ATTACK_LIB + script + "\nprint('RESULT ' + json.dumps(out))\nPY\n"
    return tool_use("Bash", {"command": command, "description": "probe", "timeout": 300000}, id=id)


# --- 1. back-channel tools without a grant ------------------------------------------------------

UNGRANTED = """
for tool, args in (
    ("record_progress", {"message": "progress through the CLI"}),  # allowed once, used once
    ("spawn_subtask", {"name": "evil", "instructions": "spawn me"}),  # denied by the policy
    ("report_summary", {"summary": "forged summary"}),  # never asked for
    ("ask_user", {"question": "forged question?"}),
):
    for via in ("relay", "socket"):
        r = mcp(tool, args, via=via)
        out[tool + " " + via] = {"status": r["status"], "body": r["body"]}
"""


def test_back_channel_tools_without_a_grant_are_refused_recorded_and_do_nothing(world: World) -> None:
    """A grant comes from one allowed pre_tool_use for exactly that input, and is used once. The
    CLI calls record_progress (allowed: done once) and spawn_subtask (denied: never called); then a
    shell command holding the run token calls the back-channel itself: the used grant, the denied
    tool, and two tools no policy was asked about. Each answers an error, nothing is done (one
    progress note, no subtask, no summary, no question), and the transcript records the refusal."""
    tag = "[held-mcp]"
    progress = tool_use("mcp__forgehand__record_progress", {"message": "progress through the CLI"}, id="toolu_mcp_cli")
    spawn = tool_use("mcp__forgehand__spawn_subtask", {"name": "evil", "instructions": "spawn me"}, id="toolu_mcp_deny")
    shell = bash(UNGRANTED, "toolu_mcp_shell")
    steps = [
        Step("toolu_mcp_cli", progress),
        Step("toolu_mcp_deny", spawn),
        Step("toolu_mcp_shell", shell, stop_after=True),
    ]
    world.router.add(tag, steps)

    async def drive(c: httpx.AsyncClient) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        number = await start(c, f"{tag} use the back-channel")
        done = await wait_for(c, number, resting("awaiting_review", 1))
        return done, await all_events(c, number)

    done, events = world.drive(drive)
    result = script_result(events, "toolu_mcp_shell")
    assert len(result) == 8, result
    for what, r in result.items():
        assert r["status"] == 200 and '"isError": true' in r["body"], (what, r)
        assert "policy did not allow" in r["body"], (what, r)
    assert [e["payload"]["text"] for e in events if e["kind"] == "progress"] == ["progress through the CLI"]
    assert done["subtasks"] == 0 and done["question"] == "" and done["state"] == "awaiting_review", done
    assert done["runs"][0]["summary_reported"] is False and "forged" not in done["summary"]
    # The CLI's spawn_subtask was decided (denied) by the policy; the shell's calls asked nobody.
    asked = [d["tool_name"] for d in world.consumer.pre_tool_use() if d["tool_use_id"].startswith("toolu_mcp")]
    assert asked == ["mcp__forgehand__record_progress", "mcp__forgehand__spawn_subtask", "Bash"], asked
    notices = [e["payload"]["text"] for e in events if e["kind"] == "notice"]
    refused = [t for t in notices if "no policy decision" in t]
    assert len(refused) == 4 and all("nothing was done" in t for t in refused), refused  # one per tool
    assert not any(e["kind"] == "policy_bypass" for e in events)


# --- 2. tokens of an ended and of another live run ------------------------------------------------

STOLEN = """
ended = open("/workspace/leaked-token.txt").read().strip()
tokens = {"ended": ended, "foreign": FOREIGN}
out["distinct"] = len({ended, FOREIGN, TOKEN}) == 3
for name, tok in tokens.items():
    hook = {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash",
            "tool_input": {"command": "echo stolen"}, "tool_use_id": "toolu_stolen_" + name}
    out[name] = {
        "messages x-api-key": call("/v1/messages", model_body("stolen-call"), {"x-api-key": tok})["status"],
        "messages bearer relay": call("/v1/messages", model_body("stolen-call"), bearer(tok), via="relay")["status"],
        "hook": call("/hooks/claude/PreToolUse", hook, bearer(tok))["status"],
        "mcp socket": mcp("record_progress", {"message": "stolen " + name}, tok, via="socket")["status"],
        "mcp relay": mcp("record_progress", {"message": "stolen " + name}, tok)["status"],
    }
out["own"] = call("/mcp", {"jsonrpc": "2.0", "id": 1, "method": "ping"}, bearer(TOKEN), via="relay")["status"]
"""


def test_tokens_of_an_ended_run_and_of_another_live_run_get_401_and_reach_nothing(world: World) -> None:
    """Task B's first run writes its token into the workspace (it lands on the task branch); task
    D's run prints its own and then waits, live, on its next model call. The model hands D's
    token to B's second run, which also reads the first run's token from the checkout: both, on
    B's socket and on its relay, for the model API, a hook and the back-channel, get 401, and
    nothing reaches the model, the policy or either task's transcript. B's own token works."""
    b_tag, d_tag = "[held-token-b]", "[held-token-d]"
    foreign: list[str] = []
    attacked = threading.Event()

    def listen_d(messages: list[dict[str, Any]]) -> None:
        if not foreign and (found := TOKEN_RE.findall(json.dumps(messages[1:]))):
            foreign.append(found[0])

    def hold_d() -> Turn:  # D's run stays live (its model call open) until B has tried its token
        attacked.wait(300)
        return text("done")

    def attack() -> Turn:
        return bash(f"FOREIGN = {foreign[0]!r}\n" + STOLEN, "toolu_b_attack")

    def listen_b(messages: list[dict[str, Any]]) -> None:
        if "toolu_b_attack" in set().union(*(_results(m) for m in messages)):
            attacked.set()

    leak = {"command": 'printf %s "$FORGEHAND_RUN_TOKEN" > /workspace/leaked-token.txt', "description": "keep"}
    leaking = Step("toolu_b_leak", tool_use("Bash", leak, id="toolu_b_leak"), stop_after=True)
    world.router.add(b_tag, [leaking, Step("toolu_b_attack", attack)], listen_b)
    show = {"command": 'echo "$FORGEHAND_RUN_TOKEN"', "description": "show"}
    showing = Step("toolu_d_show", tool_use("Bash", show, id="toolu_d_show"))
    world.router.add(d_tag, [showing, Step("-", hold_d)], listen_d)

    async def drive(c: httpx.AsyncClient) -> tuple[dict[str, Any], int, int]:
        b = await start(c, f"{b_tag} keep a note")
        first = await wait_for(c, b, resting("awaiting_review", 1))
        d = await start(c, f"{d_tag} show the token")
        await until(lambda: foreign, timeout=240, what="D's token to reach the model")
        assert (await c.get(f"{TASKS}/{d}")).json()["state"] == "running"
        r = await c.post(f"{TASKS}/{b}/reviews", json={"verdict": "request_changes", "body": "again"})
        assert r.status_code == 201, r.text
        try:
            await wait_for(c, b, resting("awaiting_review", 2))
        finally:
            attacked.set()
        await wait_for(c, d, resting("awaiting_review", 1))
        return first, b, d

    first, b, d = world.drive(drive)
    leaked = tree_files(world.env.repo_path, first["head_sha"])["leaked-token.txt"][1].decode()
    assert TOKEN_RE.fullmatch(leaked), "the first run's token was not left in the checkout"
    events = {b: world.drive(lambda c: all_events(c, b)), d: world.drive(lambda c: all_events(c, d))}
    result = script_result(events[b], "toolu_b_attack")
    assert result["distinct"] is True and result["own"] == 200, result
    for name in ("ended", "foreign"):
        assert set(result[name].values()) == {401}, (name, result[name])
    assert not model_saw(world.api, "stolen-call")
    assert not any(d["tool_use_id"].startswith("toolu_stolen") for d in world.consumer.pre_tool_use())
    for n in (b, d):
        assert not any("stolen" in e["payload"].get("text", "") for e in events[n] if e["kind"] == "progress")


# --- 3. approval replay ------------------------------------------------------------------------

APPROVED = {"command": "echo ran >> /workspace/needs-approval.txt", "description": "append"}
# A hook call forged for run 1's approved call (its id and input), from run 2's shell; the literal
# that makes the policy ask is split so this command itself is not asked about.
REPLAY = """
hook = {"session_id": "s", "hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_use_id": "toolu_appr_1",
        "tool_input": {"command": "echo ran >> /workspace/needs-" + "approval.txt", "description": "append"}}
r = call("/hooks/claude/PreToolUse", hook, bearer(TOKEN))
out["replay"] = {"status": r["status"], "body": r["body"]}
"""


def test_an_approval_covers_one_call_and_a_replay_asks_again(world: World) -> None:
    """The policy asks about a Bash call; a person approves it; the next run makes that call and it
    runs (once, without asking). The run then forges the hook call of the approved call (its id,
    its input) and makes the same call again: the forged one is refused without asking anyone,
    the repeat is asked about again and waits for a person, who denies it. The file holds one
    line: the approval let exactly one call run."""
    tag = "[held-approval]"
    world.router.add(
        tag,
        [
            Step("toolu_appr_1", tool_use("Bash", APPROVED, id="toolu_appr_1")),
            Step("toolu_appr_2", tool_use("Bash", APPROVED, id="toolu_appr_2")),
            Step("toolu_appr_3", bash(REPLAY, "toolu_appr_3")),
            Step("toolu_appr_4", tool_use("Bash", APPROVED, id="toolu_appr_4")),
        ],
    )

    async def drive(c: httpx.AsyncClient) -> tuple[dict[str, Any], dict[str, Any], int]:
        n = await start(c, f"{tag} append a line")
        first = (await wait_for(c, n, resting("blocked", 1)))["pending_approval"]
        url = f"{TASKS}/{n}/approvals/{first['id']}"
        r = await c.post(url, json={"decision": "approve", "input_hash": first["input_hash"]})
        assert r.status_code == 200, r.text
        second = (await wait_for(c, n, resting("blocked", 2)))["pending_approval"]
        # The decision already taken is not taken again (nor for the new call).
        r = await c.post(url, json={"decision": "approve", "input_hash": first["input_hash"]})
        assert r.status_code == 409 and r.json()["code"] == "approval_not_pending", r.text
        r = await c.post(f"{TASKS}/{n}/approvals/{second['id']}", json={"decision": "deny", "reason": "once is enough"})
        assert r.status_code == 200, r.text
        done = await wait_for(c, n, resting("awaiting_review", 3))
        return first, {**second, "done": done}, n

    first, second, n = world.drive(drive)
    done = second.pop("done")
    events = world.drive(lambda c: all_events(c, n))
    assert (first["tool_use_id"], first["tool_input"]) == ("toolu_appr_1", APPROVED)
    assert (second["tool_use_id"], second["tool_input"]) == ("toolu_appr_4", APPROVED)
    assert second["id"] != first["id"]
    assert tree_files(world.env.repo_path, done["head_sha"])["needs-approval.txt"][1] == b"ran\n"
    asked = [d["tool_use_id"] for d in world.consumer.pre_tool_use() if d["tool_use_id"].startswith("toolu_appr")]
    assert asked == ["toolu_appr_1", "toolu_appr_3", "toolu_appr_4"], asked  # not _2 (approved), not a replay
    replay = script_result(events, "toolu_appr_3")["replay"]
    assert replay["status"] == 200 and '"permissionDecision": "deny"' in replay["body"], replay
    assert [r["kind"] for r in done["runs"]] == ["start", "approval", "approval"]


# --- 4. other attempts on the channel and the gateway --------------------------------------------

PROBES = """
own = bearer(TOKEN)
# Hook paths that climb out of /hooks towards the model API (raw, percent-encoded, doubled slashes).
for target in ("/hooks/../v1/messages", "/hooks/claude/../../v1/messages", "/hooks/%2e%2e/v1/messages",
               "/hooks/claude/..%2f..%2fv1%2fmessages", "/hooks//claude/PreToolUse", "/hooks/claude/PreToolUse/"):
    out["path " + target] = call(target, model_body("climbed-out-of-hooks"), own)
# Hook calls for another agent, and for another session under a made-up id and under this call's own id.
forged = {"hook_event_name": "PreToolUse", "tool_name": "Bash", "tool_input": {"command": "echo other-session"}}
out["agent codex"] = call("/hooks/codex/PreToolUse", {**forged, "session_id": "s", "tool_use_id": "toolu_codex"}, own)
out["session made-up id"] = call("/hooks/claude/PreToolUse", {**forged, "session_id": "another-session",
                                  "transcript_path": "/home/agent/.claude/projects/x/another-session.jsonl",
                                  "tool_use_id": "toolu_other_session"}, own)
out["session own id"] = call("/hooks/claude/PreToolUse", {**forged, "session_id": "another-session",
                             "tool_use_id": "toolu_probes"}, own)
# Oversized bodies: hooks and the back-channel take 8 MiB, model calls 32 MiB.
big = b'{"tool_name": "Bash", "tool_input": {"command": "' + b"x" * (9 << 20) + b'"}}'
out["big hook"] = call("/hooks/claude/PreToolUse", big, own)["status"]
out["big mcp"] = call("/mcp", big, own)["status"]
huge = json.dumps(model_body("oversized-model-call " + "y" * (33 << 20))).encode()
out["huge model call"] = call("/v1/messages", huge, {"x-api-key": TOKEN})["status"]
# The provider this run does not speak (its key is the operator's OpenAI key).
chat = {"model": "gpt-test", "messages": [{"role": "user", "content": "other-provider-call"}]}
out["openai chat"] = call("/v1/chat/completions", chat, own)
out["openai responses"] = call("/v1/responses", {"model": "gpt-test", "input": "other-provider-call"}, own, via="relay")
# The upstream moved by a Host, forwarding headers, an absolute request target, a model of its own.
moved = {"Host": "evil.example", "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "http",
         "Forwarded": "host=evil.example", "X-Original-URL": "http://evil.example/steal", "x-api-key": TOKEN}
out["host override"] = call("/v1/messages", model_body("host-override-call", model="claude-opus-4-1"), moved)
out["absolute target"] = call("http://evil.example/v1/messages", model_body("absolute-target-call"),
                              {"x-api-key": TOKEN}, via="relay")
"""


@pytest.fixture(scope="module")
def probes(world: World) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One run's shell tries every probe above on its own socket and relay with its own token."""
    tag = "[held-probes]"
    world.router.add(tag, [Step("toolu_probes", bash(PROBES, "toolu_probes"), stop_after=True)])

    async def drive(c: httpx.AsyncClient) -> list[dict[str, Any]]:
        n = await start(c, f"{tag} look around")
        await wait_for(c, n, resting("awaiting_review", 1))
        return await all_events(c, n)

    events = world.drive(drive)
    return script_result(events, "toolu_probes"), events


def test_hook_paths_that_climb_out_of_hooks_reach_nothing(world: World, probes: tuple[dict[str, Any], Any]) -> None:
    result, _ = probes
    paths = {k: v for k, v in result.items() if k.startswith("path ")}
    assert len(paths) == 6
    for target, r in paths.items():
        assert r["status"] == 404 and "expected /hooks/{agent}/{event}" in r["body"], (target, r)
    assert not model_saw(world.api, "climbed-out-of-hooks")


def test_hook_calls_for_another_agent_or_session_ask_no_policy(
    world: World, probes: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    """The agent's name in the path must be the run's; a forged call under another session's id
    is refused like any id the CLI never announced, and under this call's own (decided) id with
    another input it gets no decision either: the session named in the body counts for nothing."""
    result, _ = probes
    for name in ("agent codex", "session made-up id", "session own id"):
        r = result[name]
        assert r["status"] == 200 and '"permissionDecision": "deny"' in r["body"], (name, r)
    assert "no codex agent" in result["agent codex"]["body"]
    assert "announced" in result["session made-up id"]["body"]
    assert "not the one policy decided" in result["session own id"]["body"]
    asked = [d["tool_use_id"] for d in world.consumer.pre_tool_use()]
    assert "toolu_codex" not in asked and "toolu_other_session" not in asked
    assert asked.count("toolu_probes") == 1  # the shell call itself, once


def test_oversized_hook_mcp_and_model_bodies_are_refused(world: World, probes: tuple[dict[str, Any], Any]) -> None:
    result, _ = probes
    assert (result["big hook"], result["big mcp"], result["huge model call"]) == (413, 413, 413), result
    assert not model_saw(world.api, "oversized-model-call")
    assert not any(len(json.dumps(d["tool_input"])) > 1 << 20 for d in world.consumer.pre_tool_use())


def test_a_call_for_the_provider_the_run_does_not_speak_reaches_no_endpoint(
    world: World, probes: tuple[dict[str, Any], Any]
) -> None:
    """The instance has an OpenAI key too; a claude-code run's channel has no OpenAI upstream."""
    result, _ = probes
    for name in ("openai chat", "openai responses"):
        r = result[name]
        assert r["status"] == 503 and "no openai model endpoint" in r["body"], (name, r)
    assert world.openai.requests == []


def test_host_forwarding_headers_and_an_absolute_target_do_not_move_the_upstream(
    world: World, probes: tuple[dict[str, Any], Any]
) -> None:
    """Both calls reach the configured endpoint only, with the operator's key, the run's model and
    none of the agent's headers but the ones passed on by name."""
    result, _ = probes
    assert result["host override"]["status"] == 200 and result["absolute target"]["status"] == 200, result
    port = world.api.url.rsplit(":", 1)[1]
    for marker in ("host-override-call", "absolute-target-call"):
        [seen] = direct_calls(world.api, marker)
        assert seen.headers["host"] == f"127.0.0.1:{port}", seen.headers
        assert seen.headers["x-api-key"] == KEY and seen.body["model"] == "claude-test"
        leaked = {"x-forwarded-host", "x-forwarded-proto", "forwarded", "x-original-url", "authorization"}
        assert not leaked & set(seen.headers), seen.headers
        assert "evil" not in json.dumps(seen.headers)
