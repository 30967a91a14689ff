"""A scripted ACP agent for tests: a small Python program speaking the Agent Client Protocol
(JSON-RPC, one object per line) on stdio, run on the host or inside the sandbox (python3 is in the
plain image) as `python3 -S -c SCRIPT SCENARIO_JSON` (only the standard library: no site
packages), so the real spawn path is tested.

The scenario is `{"turns": [[step, ...], ...], "log": PATH?, "load": bool}`: the n-th prompt of a
session plays `turns[n]` (the last one repeats). Sessions live in `$HOME/.scripted-acp/<id>/`, so
`session/load` works exactly when the runtime carried `$HOME` over. Steps:

- `{"update": {...}}`: a `session/update` notification with that update;
- `{"permission": {toolCall, options}, "id"?: fixed JSON-RPC id}`: a `session/request_permission`
  request; the answer is recorded and, when it selects an option whose kind is `allow_once`, the
  tool "runs": a `rawInput.command` runs with `sh -c` in the cwd, and a `tool_call_update`
  (completed with its output, or failed when not permitted) follows;
- `{"duplicate": true}` on a permission step: the same request is sent twice with one id;
- `{"stray": true}`: a response to a request id forgehand never sent, then another one to the
  `initialize` request already answered;
- `{"noise": "text"}`: a line that is not JSON;
- `{"fs_read": PATH}`: a `fs/read_text_file` request (forgehand offers no fs: it must refuse);
- `{"exit": CODE}`: exit now, mid-prompt (stderr says why);
- `{"wait_file": PATH}`: wait until PATH exists (the test's go-ahead; the agent exits with 3
  after a minute without it);
- `{"fail": {"code", "message"}}`: answer the prompt with that JSON-RPC error;
- `{"wait_cancel": true}`: wait for `session/cancel`, then go on with the next step (a
  permission request after it, say) and end the prompt with `cancelled`;
- `{"chunks": N, "text": T}`: N `agent_message_chunk` updates of T each;
- `{"calls": N}`: N read calls of 4 updates each (a chunk, the call, its start, its completion;
  the speed bench), written as fast as the agent makes them (the pipe gets them a buffer at a time).

The log (JSON lines) holds everything the agent received, for the test to read."""

import json

SCRIPT = r"""
import json, os, subprocess, sys, time, uuid

scenario = json.loads(sys.argv[1])
LOG = scenario.get("log")
home = os.environ.get("HOME", "/tmp")
root = os.path.join(home, ".scripted-acp")
pending_lines = []
state = {"cancelled": False, "init_id": None}


def log(obj):
    if LOG:
        with open(LOG, "a") as fh:
            fh.write(json.dumps(obj) + "\n")


def send(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def read():
    if pending_lines:
        return pending_lines.pop(0)
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)
    msg = json.loads(line)
    log(msg)
    return msg


def wait_response(rid):
    while True:
        msg = read()
        if msg.get("id") == rid and "method" not in msg:
            return msg
        if msg.get("method") == "session/cancel":
            state["cancelled"] = True
            continue
        pending_lines.append(msg)
        # requests from the client while waiting are not expected; keep them for later
        if len(pending_lines) > 100:
            sys.exit(3)


def update(sid, upd):
    send({"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId": sid, "update": upd}})


def turn_steps(sid):
    turns = scenario.get("turns") or [[]]
    counter = os.path.join(root, sid, "count")
    n = int(open(counter).read()) if os.path.exists(counter) else 0
    with open(counter, "w") as fh:
        fh.write(str(n + 1))
    return turns[min(n, len(turns) - 1)]


def permission(sid, step, cwd):
    req = step["permission"]
    rid = step.get("id", "perm-" + uuid.uuid4().hex[:8])
    msg = {"jsonrpc": "2.0", "id": rid, "method": "session/request_permission",
           "params": {"sessionId": sid, **req}}
    send(msg)
    if step.get("duplicate"):
        send(msg)
    answer = wait_response(rid)
    log({"answer_to": rid, "answer": answer})
    if step.get("duplicate"):
        second = wait_response(rid)
        log({"second_answer_to": rid, "answer": second})
    call = req.get("toolCall") or {}
    outcome = (answer.get("result") or {}).get("outcome") or {}
    chosen = [o for o in req.get("options") or [] if o.get("optionId") == outcome.get("optionId")]
    allowed = outcome.get("outcome") == "selected" and chosen and chosen[0].get("kind") == "allow_once"
    call_id = call.get("toolCallId")
    if allowed:
        command = (call.get("rawInput") or {}).get("command")
        out = subprocess.run(["sh", "-c", command], cwd=cwd, capture_output=True, text=True).stdout if command else "ok"
        update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "completed",
                     "content": [{"type": "content", "content": {"type": "text", "text": out}}]})
    else:
        update(sid, {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "failed",
                     "content": [{"type": "content", "content": {"type": "text", "text": "not permitted"}}]})


def prompt(rid, params, cwd):
    sid = params["sessionId"]
    state["cancelled"] = False
    for step in turn_steps(sid):
        if "update" in step:
            update(sid, step["update"])
        elif "permission" in step:
            permission(sid, step, cwd)
        elif step.get("stray"):
            send({"jsonrpc": "2.0", "id": 987654, "result": {"bogus": True}})
            send({"jsonrpc": "2.0", "id": state["init_id"], "result": {"protocolVersion": 1}})
        elif "noise" in step:
            sys.stdout.write(step["noise"] + "\n")
            sys.stdout.flush()
        elif "fs_read" in step:
            send({"jsonrpc": "2.0", "id": "fs-1", "method": "fs/read_text_file",
                  "params": {"sessionId": sid, "path": step["fs_read"]}})
            log({"fs_answer": wait_response("fs-1")})
        elif "exit" in step:
            sys.stderr.write("scripted agent: exiting mid-prompt\n")
            sys.stderr.flush()
            os._exit(step["exit"])
        elif "wait_file" in step:
            deadline = time.monotonic() + 60
            while not os.path.exists(step["wait_file"]):
                if time.monotonic() > deadline:
                    sys.stderr.write("scripted agent: no go-ahead at " + step["wait_file"] + "\n")
                    sys.stderr.flush()
                    os._exit(3)
                time.sleep(0.01)
        elif "fail" in step:
            send({"jsonrpc": "2.0", "id": rid, "error": step["fail"]})
            return
        elif step.get("wait_cancel"):
            while not state["cancelled"]:
                msg = read()
                if msg.get("method") == "session/cancel":
                    state["cancelled"] = True
        elif "calls" in step:
            # A call's four updates encoded once, the number put in per call: json.dumps of each
            # took the agent more CPU than forgehand's reading of them.
            mark = "@N@"
            text = {"type": "text", "text": "step " + mark}
            out = {"type": "content", "content": {"type": "text", "text": "line " + mark + "\n"}}
            call_id = "call-" + mark
            shapes = [
                {"sessionUpdate": "agent_message_chunk", "content": text},
                {"sessionUpdate": "tool_call", "toolCallId": call_id, "title": "Read", "kind": "read",
                 "status": "pending", "rawInput": {"path": "/workspace/f" + mark + ".txt"}},
                {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "in_progress"},
                {"sessionUpdate": "tool_call_update", "toolCallId": call_id, "status": "completed",
                 "content": [out]},
            ]
            template = "".join(
                json.dumps({"jsonrpc": "2.0", "method": "session/update",
                            "params": {"sessionId": sid, "update": shape}}) + "\n"
                for shape in shapes
            )
            for i in range(step["calls"]):
                sys.stdout.write(template.replace(mark, str(i)))
            sys.stdout.flush()
        elif "chunks" in step:
            text = step.get("text", "x")
            for _ in range(step["chunks"]):
                update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}})
    reason = "cancelled" if state["cancelled"] else "end_turn"
    send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": reason,
          "usage": {"inputTokens": 11, "outputTokens": 7, "totalTokens": 18}}})


def main():
    cwd = "/workspace" if os.path.isdir("/workspace") else os.getcwd()  # on the host: its cwd
    while True:
        msg = read()
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            state["init_id"] = rid
            send({"jsonrpc": "2.0", "id": rid, "result": {
                "protocolVersion": 1,
                "agentCapabilities": {"loadSession": bool(scenario.get("load", True))},
                "agentInfo": {"name": "scripted-acp", "version": "0.0.1"}, "authMethods": []}})
        elif method == "session/new":
            sid = "sess-" + uuid.uuid4().hex[:12]
            os.makedirs(os.path.join(root, sid), exist_ok=True)
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": sid}})
        elif method == "session/load":
            sid = params.get("sessionId")
            if not os.path.isdir(os.path.join(root, str(sid))):
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32002, "message": "no such session"}})
                continue
            update(sid, {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "earlier"}})
            update(sid, {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": "replayed"}})
            send({"jsonrpc": "2.0", "id": rid, "result": {}})
        elif method == "session/prompt":
            prompt(rid, params, cwd)
        elif method == "session/cancel":
            state["cancelled"] = True
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "method not found"}})


main()
"""


def argv(scenario: dict[str, object], *, python: str = "python3") -> list[str]:
    """The agent's command line (for a task: an operator's `command`). On the host, pass
    `sys.executable`: a `python3` found on PATH may be a version manager's shim, which took
    150 ms to start the agent here, a tenth of a bench's pass."""
    return [python, "-S", "-c", SCRIPT, json.dumps(scenario)]


def tool_call(call_id: str, command: str, *, title: str = "", kind: str = "execute") -> dict[str, object]:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": call_id,
        "title": title or f"`{command}`",
        "kind": kind,
        "status": "pending",
        "rawInput": {"command": command},
    }


OPTIONS = [
    {"optionId": "always", "name": "Always allow", "kind": "allow_always"},
    {"optionId": "once", "name": "Allow", "kind": "allow_once"},
    {"optionId": "no", "name": "Reject", "kind": "reject_once"},
    {"optionId": "never", "name": "Always reject", "kind": "reject_always"},
]


def ask(call_id: str, command: str, options: list[dict[str, str]] | None = None, **step: object) -> dict[str, object]:
    """A permission step for a shell call (the options in an order where position would lie)."""
    call = {"toolCallId": call_id, "title": f"`{command}`", "kind": "execute", "rawInput": {"command": command}}
    return {"permission": {"toolCall": call, "options": OPTIONS if options is None else options}, **step}


def say(text: str) -> dict[str, object]:
    return {"update": {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}}
