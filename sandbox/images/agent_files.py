"""The files the agents image adds besides the CLIs: Claude Code's managed settings, Codex's
requirements and the hook bridge `forgehand-hook` (texts here, so an installed package can build the
image; the TCP relay `forgehand-relay` is relays.RELAY_SCRIPT; deploy/sandbox/agents/ holds
identical copies, a unit test keeps them equal).

Measured with Claude Code 2.1.332 (the native binary, in this image, network none, uid 1000, a
scripted Anthropic server and the hook endpoint on a Unix socket through the channel mount; the
tests in tests/docker/sandbox/test_image_agents.py repeat each point):
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
from pathlib import Path

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

# The hook bridge, run by the image's python3 as /usr/local/bin/forgehand-hook (its docstring says what
# it does). A file of the package, read as text, like the relay; its `TIMEOUT` is HOOK_TIMEOUT_SECONDS
# (a unit test keeps them equal), and its bytes are part of the image's recipe digest.
HOOK_SCRIPT = (Path(__file__).parent / "forgehand-hook").read_text(encoding="utf-8")
