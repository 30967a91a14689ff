"""The files the agents image adds besides the CLIs: Claude Code's managed settings, Codex's
requirements and the hook bridge `forgehand-hook` (texts here, so an installed package can build the
image; the TCP relay `forgehand-relay` is relays.RELAY_SCRIPT; deploy/sandbox/agents/ holds
identical copies, a unit test keeps them equal).

Measured with Claude Code 2.1.332 (the native binary, in this image, network none, uid 1000, a
scripted Anthropic server and the hook endpoint on a Unix socket through the channel mount; the
tests in tests/docker/test_image_agents.py repeat each point):
- `/etc/claude-code/managed-settings.json` is read; with `allowManagedHooksOnly: true` its hooks run
  even when the workspace's `.claude/settings.json` says `{"disableAllHooks": true}` and brings hooks
  of its own (those never run), with or without `--setting-sources user`.
- Command hooks accept `onFailure` ("continue" by default, or "block") next to `timeout` (seconds)
  in the settings schema (the binary's zod schema for command, http and mcp hooks).
- A `PreToolUse` hook gets `{session_id, transcript_path, cwd, permission_mode, hook_event_name,
  tool_name, tool_input, tool_use_id}` on stdin; it answers on stdout with
  `{"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": "allow"|"deny"|"ask",
  "permissionDecisionReason": ...}}` and exit 0; exit 2 blocks the call and its stderr reaches the
  model as the reason. `PostToolUse` gets `tool_response` as well; `{"decision": "block", "reason"}`
  (or exit 2) feeds the reason back to the model.
- The matcher `*` matches every tool, MCP tools included.

Why no `Stop` hook: a failing Stop hook (exit 2) keeps the agent from stopping, so a gateway that is
down would loop the agent until a watchdog ends it; the runtime applies the `stop` policy itself.

- Settings `env` reaches the hooks' processes: `~/.claude/settings.json` with
  `{"env": {"LD_PRELOAD": "/workspace/x.so"}}` (which an agent allowed to write files could create)
  loaded that library into the hook commands; the same key in the managed settings outranks it
  (the library was not loaded). The repository's `env` did not reach them. Hence `env` below.
- A hook answer whose `hookEventName` is not the hook's event is refused by the CLI ("Hook
  returned incorrect event name"), which, with `onFailure: "block"`, blocks.
- Untrusted workspaces: the repository's `permissions.allow` is ignored with a warning on stderr
  unless `~/.claude.json` marks the workspace trusted; the tests mark it trusted (the worst case).

Measured with Codex 0.171.0 (the static binary, in the sandbox image, uid 1000, read-only root, a
scripted Responses server; tests/docker/test_codex_*.py repeat the points that matter):
- `/etc/codex/requirements.toml` is read without a trust prompt: its `[hooks]` (`PreToolUse` /
  `PostToolUse` matcher groups of `command` hooks, `timeout` in seconds) run, and with
  `allow_managed_hooks_only = true` hooks from anywhere else (`~/.codex/config.toml`, the
  repository's `.codex/config.toml` or `.codex/hooks.json`, even a trusted project) never run.
  `[features] hooks = true` there keeps them on against `--disable hooks` and a user or project
  `[features] hooks = false`; an `[mcp_servers]` allow-list (only forgehand's back-channel) starts no
  MCP server a user or project config names.
- A PreToolUse hook gets `{session_id, turn_id, transcript_path, cwd, hook_event_name, model,
  permission_mode, tool_name, tool_input, tool_use_id}`; shell calls (`exec_command`) arrive as
  `tool_name` "Bash" with `{"command": ...}`, `apply_patch` as "apply_patch" with `{"command":
  PATCH}`. PostToolUse adds `tool_response` (the output text).
- The call is blocked only by exit 0 with `permissionDecision: "deny"` and a non-empty
  `permissionDecisionReason`, or by exit 2 with the reason on stderr; the model then reads "Command
  blocked by PreToolUse hook: REASON. Command: ...". `allow` with `updatedInput` runs the rewritten
  input. Everything else lets the call run: exit 1, a timeout, `ask`, `allow` without
  `updatedInput`, a deny without a reason, output that is not JSON. So the bridge, for `codex`,
  passes on only a deny with a reason (as exit 2) or an allow with a rewrite, prints nothing for a
  plain allow, and denies whatever else it gets.
- `write_stdin` (typing into a running `exec_command` session) reaches no hook: with a TTY an
  allowed `bash` would run whatever is typed into it. `unified_exec_tty = false` pinned here makes
  write_stdin fail ("stdin is closed for this session").

The hook bridge trusts nothing from the process environment but the token: the socket path is
fixed, python runs isolated (`-I`: no PYTHONPATH, no user site), and every failure denies.
"""

import json

HOOK_TIMEOUT_SECONDS = 120
HOOK_EVENTS = ("PreToolUse", "PostToolUse")
HOOK_PATH = "/usr/local/bin/forgehand-hook"
RELAY_PATH = "/usr/local/bin/forgehand-relay"
MANAGED_SETTINGS_PATH = "/etc/claude-code/managed-settings.json"
CODEX_REQUIREMENTS_PATH = "/etc/codex/requirements.toml"
RELAY_PORT = 4100  # the gateway relay's port inside the container (sandbox.spec GATEWAY_RELAY_PORT)
# Variables that make a process load code or data it did not choose: the dynamic loader's, glibc's
# locale and iconv modules, and the start-up files of shells. Pinned empty in the managed settings'
# `env` (which outranks user settings), so a hook never starts under the agent's values; an empty
# value is the same as unset for each of them.
PINNED_EMPTY_ENV = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "LOCPATH", "BASH_ENV", "ENV")
# Claude Code's own variables that change what runs a hook, a tool or a process the CLI starts (read
# in the 2.1.332 binary; an empty value is the same as unset for each): the program every shell-form
# hook, Bash call and stdio MCP server is run through, the shell of the Bash tool, the launcher of
# background sessions and teammates, extra plugin directories (plugins bring hooks, skills and MCP
# servers), the cross-session messaging socket and its token, and function hooks.
PINNED_EMPTY_CLAUDE_ENV = (
    "CLAUDE_CODE_SHELL_PREFIX",
    "CLAUDE_CODE_SHELL",
    "CLAUDE_CODE_PROCESS_WRAPPER",
    "CLAUDE_CODE_TEAMMATE_COMMAND",
    "CLAUDE_CODE_PLUGIN_DIRS",
    "CLAUDE_CODE_PLUGIN_SEED_DIR",
    "CLAUDE_CODE_MESSAGING_SOCKET",
    "CLAUDE_CODE_MESSAGING_TOKEN",
    "CLAUDE_CODE_ENABLE_FUNCTION_HOOKS",
)
# Pinned to a value: the login shell the Bash tool picks from (the image's bash), agent teams off,
# and the cross-session messaging inbox off (`CLAUDE_CODE_HARBOR_KITE` is the switch the CLI reads
# before its feature flag; with it "0" no socket is bound, so no process in the sandbox can put text
# before the model as another session's message).
PINNED_ENV = {"SHELL": "/bin/bash", "CLAUDE_CODE_EXPERIMENTAL_AGENT_TEAMS": "0", "CLAUDE_CODE_HARBOR_KITE": "0"}


def _managed_settings() -> str:
    hooks = {
        event: [
            {
                "matcher": "*",
                "hooks": [
                    {
                        # Exec form ("args" present): the CLI starts the bridge itself, with no
                        # shell and no shell prefix in between.
                        "type": "command",
                        "command": HOOK_PATH,
                        "args": ["claude", event],
                        # A little longer than the bridge's own timeout, so the bridge's deny wins.
                        "timeout": HOOK_TIMEOUT_SECONDS + 10,
                        "onFailure": "block",
                    }
                ],
            }
        ]
        for event in HOOK_EVENTS
    }
    settings = {
        "allowManagedHooksOnly": True,
        # Permission rules (allow lists, default modes) only from here, and there are none: a rule
        # the agent writes into ~/.claude/settings.json, or the repository brings, is not applied.
        "allowManagedPermissionRulesOnly": True,
        "disableAllHooks": False,
        # A skill's or custom command's inline !`cmd` is shown as a placeholder, never run (it would
        # run outside any tool call, so outside the policy).
        "disableSkillShellExecution": True,
        # Managed env outranks the user's (and the repository's): an agent that writes
        # ~/.claude/settings.json cannot preload a library into the hook bridge, nor re-route how
        # hooks, tools and the processes of the CLI are started.
        "env": {**dict.fromkeys(PINNED_EMPTY_ENV + PINNED_EMPTY_CLAUDE_ENV, ""), **PINNED_ENV},
        "hooks": hooks,
    }
    return json.dumps(settings, indent=2) + "\n"


MANAGED_SETTINGS = _managed_settings()


def _codex_requirements() -> str:
    lines = [
        "# forgehand: Codex's managed requirements (read-only, root's). Hooks come only from here and",
        "# cannot be switched off; no MCP server starts that this file does not allow; typing into a",
        "# running command (write_stdin, which no hook sees) needs a TTY, and TTYs are off.",
        "allow_managed_hooks_only = true",
        "",
        "[features]",
        "hooks = true",
        "unified_exec_tty = false",
        "",
        # The one MCP server allowed: forgehand's back-channel, through the relay to the run's socket.
        "[mcp_servers.forgehand.identity]",
        f'url = "http://127.0.0.1:{RELAY_PORT}/mcp"',
        "",
        "[hooks]",
    ]
    for event in HOOK_EVENTS:
        lines += [
            "",
            f"[[hooks.{event}]]",
            'matcher = "*"',
            f"[[hooks.{event}.hooks]]",
            'type = "command"',
            f'command = "{HOOK_PATH} codex {event}"',
            # A little longer than the bridge's own timeout, so the bridge's deny wins.
            f"timeout = {HOOK_TIMEOUT_SECONDS + 10}",
        ]
    return "\n".join(lines) + "\n"


CODEX_REQUIREMENTS = _codex_requirements()

HOOK_SCRIPT = f'''\
#!/usr/bin/python3 -I
"""forgehand-hook AGENT EVENT: hands one agent hook to forgehand and prints its answer.

Reads the hook's JSON on stdin and POSTs it to /hooks/AGENT/EVENT on the run's socket with the
run's token. A 200 answer with a JSON object is printed as is (exit 0). Anything else (no socket,
no token, another status, a body that is not a JSON object, a timeout, any error here) never lets
the call through: it prints a deny (PreToolUse) or a block (other events), writes the reason on
stderr and exits 2, the agent's blocking exit code.

For AGENT codex the answer is translated, because Codex runs the call on anything but an explicit
deny: a PreToolUse `deny` with a reason becomes exit 2 with the reason on stderr, an `allow` with
`updatedInput` is printed, a plain `allow` prints nothing; any other answer (`ask`, no decision,
an empty reason) is a deny. A PostToolUse answer is `{{}}` or a `block` with a reason.
"""

import sys

# http.client imports ssl when it can, and importing ssl makes OpenSSL read the file OPENSSL_CONF
# names (engines and providers load code from it). A hook's environment is partly the agent's to
# shape (Claude Code's user settings `env`), so the bridge never loads OpenSSL: it speaks plain HTTP
# over a Unix socket.
sys.modules["ssl"] = None

import http.client
import json
import os
import socket

SOCKET = "/run/forgehand/gateway.sock"
TIMEOUT = {HOOK_TIMEOUT_SECONDS}


class UnixConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


def deny(event, reason):
    reason = "forgehand policy unreachable: " + reason
    if event == "PreToolUse":
        out = {{
            "hookSpecificOutput": {{
                "hookEventName": event,
                "permissionDecision": "deny",
                "permissionDecisionReason": reason,
            }}
        }}
    else:
        out = {{"decision": "block", "reason": reason}}
    sys.stdout.write(json.dumps(out) + "\\n")
    sys.stdout.flush()
    sys.stderr.write(reason + "\\n")
    sys.stderr.flush()
    os._exit(2)


def timeout():
    # Only ever shorter than the default (a test's short deadline); a longer one is ignored.
    try:
        value = float(os.environ.get("FORGEHAND_HOOK_TIMEOUT", TIMEOUT))
    except ValueError:
        return TIMEOUT
    return value if 0 < value <= TIMEOUT else TIMEOUT


def codex_answer(event, answer):
    """What Codex is told for forgehand's answer (see the docstring); denies what is unclear."""
    if event != "PreToolUse":
        if answer == {{}}:
            return None
        if answer.get("decision") == "block" and isinstance(answer.get("reason"), str) and answer["reason"].strip():
            return {{"decision": "block", "reason": answer["reason"]}}
        deny(event, "an answer Codex cannot take for " + event)
    out = answer.get("hookSpecificOutput")
    if not isinstance(out, dict) or out.get("hookEventName") != "PreToolUse":
        deny(event, "the answer holds no decision")
    decision, reason = out.get("permissionDecision"), out.get("permissionDecisionReason")
    if decision == "deny":
        text = reason.strip() if isinstance(reason, str) else ""
        sys.stderr.write((text or "denied by forgehand policy") + "\\n")
        sys.stderr.flush()
        os._exit(2)
    if decision != "allow":
        deny(event, "the decision %r is not allow or deny" % (decision,))
    updated = out.get("updatedInput")
    if updated is None:
        return None
    if not isinstance(updated, dict):
        deny(event, "the rewritten input is not a JSON object")
    rewrite = {{"hookEventName": "PreToolUse", "permissionDecision": "allow", "updatedInput": updated}}
    return {{"hookSpecificOutput": rewrite}}


def main(event):
    if len(sys.argv) != 3 or not all(a.isascii() and a.isalnum() for a in sys.argv[1:]):
        deny(event, "usage: forgehand-hook AGENT EVENT")
    agent = sys.argv[1]
    token = os.environ.get("FORGEHAND_RUN_TOKEN", "")
    if not token:
        deny(event, "no run token (FORGEHAND_RUN_TOKEN)")
    body = sys.stdin.buffer.read()
    try:
        json.loads(body)
    except ValueError:
        deny(event, "the hook input is not JSON")
    conn = UnixConnection(SOCKET, timeout())
    try:
        conn.request(
            "POST",
            "/hooks/" + agent + "/" + event,
            body=body,
            headers={{"Authorization": "Bearer " + token, "Content-Type": "application/json"}},
        )
        response = conn.getresponse()
        data = response.read(1 << 20)
    except FileNotFoundError:
        deny(event, "no socket at " + SOCKET)
    except http.client.RemoteDisconnected:
        deny(event, "the connection closed without an answer")
    except (socket.timeout, TimeoutError):
        deny(event, "no answer within %g s" % timeout())
    except OSError as exc:
        deny(event, "the socket failed: " + str(exc))
    except http.client.HTTPException as exc:
        deny(event, "a malformed HTTP answer: " + type(exc).__name__)
    finally:
        conn.close()
    if response.status != 200:
        deny(event, "HTTP %d" % response.status)
    try:
        answer = json.loads(data)
    except ValueError:
        deny(event, "the answer is not JSON")
    if not isinstance(answer, dict):
        deny(event, "the answer is not a JSON object")
    if agent == "codex":
        answer = codex_answer(event, answer)
        if answer is None:
            os._exit(0)
    sys.stdout.write(json.dumps(answer) + "\\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    EVENT = sys.argv[2] if len(sys.argv) > 2 and sys.argv[2].isascii() and sys.argv[2].isalnum() else "PreToolUse"
    try:
        main(EVENT)
    except BaseException as exc:  # whatever went wrong: deny, never allow by accident
        deny(EVENT, "the hook bridge failed: " + type(exc).__name__)
'''
