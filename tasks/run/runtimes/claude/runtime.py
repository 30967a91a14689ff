"""The `claude-code` runtime: the real Claude Code CLI inside the agents image, driven over its
stdio control channel, under forgehand's policy (docs/agents.md, "Claude Code: how policy is enforced").

What the CLI 2.1.332 does, measured on the host against a scripted Anthropic server
(`ANTHROPIC_BASE_URL=http://127.0.0.1:PORT`, `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1`, a
temporary `HOME`), and relied on here:
- `claude -p --input-format stream-json --output-format stream-json --verbose
  --permission-prompt-tool stdio --setting-sources user --model M` reads one JSON line per user
  message on stdin: `{"type":"user","session_id":"","message":{"role":"user","content":TEXT},
  "parent_tool_use_id":null}`. No `initialize` control request is needed for `can_use_tool` to
  arrive (it answers one with its commands, agents and models when sent).
- Before a tool runs it writes `{"type":"control_request","request_id":UUID,"request":{"subtype":
  "can_use_tool","tool_name","display_name","input","description","permission_suggestions":[...],
  "blocked_path"?,"tool_use_id"}}` and waits for `{"type":"control_response","response":{"subtype":
  "success","request_id","response":{"behavior":"allow","updatedInput":{}}}}` (the updated input is
  what runs) or `{"behavior":"deny","message":REASON}`: the model's next request carries
  `{"type":"tool_result","content":REASON,"is_error":true}` and the final `result` lists the call in
  `permission_denials`. `"interrupt":true` on a deny ends the turn (`[Request interrupted by user
  for tool use]`, a `result` with `stop_reason` `tool_use`, exit code 1).
- A repository `.claude/settings.json` and `.claude/settings.local.json` with
  `permissions.allow: ["Bash"]`, `defaultMode: bypassPermissions`, `disableAllHooks: true` and
  their own hooks changed nothing: `can_use_tool` still came for Bash, the repository's hook never
  ran and hooks passed by forgehand still ran (`--setting-sources user`).
- PreToolUse hooks run before `can_use_tool`; see policy_broker.py for how the two meet.
- Read-only tools (Read, Glob, Grep) never ask `can_use_tool` in the default permission mode: the
  managed hook is their gate.
- A `Task` subagent runs in the background: `system/task_started`, its lines with
  `parent_tool_use_id` = the Task call's id and an `agent_id`, `system/task_notification` when it
  ends; its tool calls ask `can_use_tool` like the parent's.
- Model traffic: only `POST /v1/messages?beta=true`, streaming, `Authorization: Bearer <token>`,
  `User-Agent: claude-cli/2.1.332 (external, sdk-cli)`; about 0.5 s from start to the first request.
- `--resume SESSION_ID` in a fresh `HOME` holding only the saved `.claude/projects/` continues the
  session with the same id; the next request carries the whole earlier conversation. Sessions live in
  `$HOME/.claude/projects/<cwd with / as ->/<id>.jsonl`, so the working directory must stay
  `/workspace`.

Resume (docs/agents.md): after each run `$HOME/.claude/projects` (the session transcripts, nothing the
agent could configure the CLI with) is archived through the sandbox (tar, capped)
into the task's state directory on the host (`<data_dir>/agents/<task uuid>/claude-home.tgz`; it is
opaque data, never unpacked on the host) and unpacked into the next run's fresh container before
`--resume`. The raw stream of each run is kept there too, capped (`runs/<run uuid>.jsonl`)."""

from sandbox.spec import HOME_DIR
from tasks.core.states import FailureReason
from tasks.run.backchannel import claude_mcp_config
from tasks.run.gateway import RunChannel
from tasks.run.runtimes.agent_process import run_agent
from tasks.run.runtimes.agent_session import CLAUDE_HOME, HOME_CAP, keep, prompt_of, restore, scrub
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.claude.drive import Drive
from tasks.run.runtimes.ledger import ANNOUNCE_WAIT

AGENT_NAME = "claude-code"
CLI_PATH = "/usr/local/bin/claude"


class ClaudeCodeRuntime:
    name = AGENT_NAME

    def __init__(
        self,
        *,
        cli: str = CLI_PATH,
        idle_seconds: float = 300.0,
        linger_seconds: float = 10.0,
        home_cap: int = HOME_CAP,
        announce_wait: float = ANNOUNCE_WAIT,
    ) -> None:
        self.cli = cli
        self.announce_wait = announce_wait  # a hook call waits this long for its id in the stream
        self.idle_seconds = idle_seconds  # stdout silent this long: killed (idle)
        self.linger_seconds = linger_seconds  # alive this long after its final result: killed
        self.home_cap = home_cap

    def needs_model(self) -> bool:
        return True

    def image_kind(self) -> str:
        return "agents"

    def argv(self, ctx: RunContext, channel: RunChannel, session: str) -> list[str]:
        model = channel.provider.anthropic_model
        argv = [
            self.cli,
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-prompt-tool",
            "stdio",
            "--setting-sources",
            "user",
            # No MCP server from anywhere (a repository's .mcp.json, a user file the agent wrote):
            # an MCP server is a process the agent would start outside any tool call's policy.
            "--strict-mcp-config",
            # ... but the run's own back-channel (tasks/run/backchannel), served by forgehand.
            *(["--mcp-config", claude_mcp_config(channel)] if ctx.backchannel is not None else []),
            "--max-turns",
            str(ctx.limits.turn_limit),
        ]
        if model:
            argv += ["--model", model]
        if session:
            argv += ["--resume", session]
        return argv

    def env(self, channel: RunChannel) -> dict[str, str]:
        model = channel.provider.anthropic_model
        env = {
            "FORGEHAND_RUN_TOKEN": channel.token,
            "ANTHROPIC_BASE_URL": "http://localhost",
            "ANTHROPIC_UNIX_SOCKET": channel.container_socket,
            "ANTHROPIC_AUTH_TOKEN": channel.token,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # As many attempts as the builtin runtime's (the CLI's default retries for minutes).
            "CLAUDE_CODE_MAX_RETRIES": "4",
            "HOME": HOME_DIR,
            # The back-channel's four tools go in the tool list itself, not behind a tool search.
            "ENABLE_TOOL_SEARCH": "false",
        }
        if model:
            env["ANTHROPIC_MODEL"] = model
        return env

    async def run(self, ctx: RunContext) -> Outcome:
        channel = ctx.channel
        if channel is None:
            raise RuntimeUnavailable("no model gateway for this run", FailureReason.MODEL_UNREACHABLE)
        session = await restore(ctx)
        argv, env = self.argv(ctx, channel, session), self.env(channel)
        drive = Drive(self, ctx, session)
        channel.set_hook_handler(drive.on_hook)
        if ctx.backchannel is not None:
            ctx.backchannel.set_question_hook(drive.broker.on_question)

        async def kept() -> None:
            ctx.agent_name = AGENT_NAME
            await keep(ctx, drive.state, drive.raw_text(), home_cap=self.home_cap)

        return await run_agent(
            ctx,
            "claude",
            argv,
            env,
            prepare=lambda: scrub(ctx, CLAUDE_HOME),
            drive=lambda proc: drive.run(proc, prompt_of(ctx, session)),
            after=kept,
        )
