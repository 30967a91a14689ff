"""The `codex` runtime: the real Codex CLI inside the agents image, `codex exec --json`, under
forgehand's policy (docs/agents.md, "Codex: how policy is enforced").

What the CLI 0.171.0 does, measured against a scripted Responses server, and relied on here:
- `codex exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox` runs one
  turn for the prompt argument and exits; stdin must be closed (a piped stdin is read and appended
  to the prompt). Its own sandbox (bubblewrap) cannot start in the hardened container: the
  container is the sandbox.
- Model traffic: only `POST {base_url}/responses`, streaming, `Authorization: Bearer` with the
  value of the provider's `env_key` variable, `User-Agent: codex_exec/0.171.0 ...`. The base URL
  must be TCP: the sandbox's relay (`SandboxSpec.relays`, 127.0.0.1:4100 in the container) forwards
  it to the run's gateway socket. `-c` overrides outrank the user's and the project's config.toml; a project
  config's `model_provider`/`model_providers` are ignored ("unsupported project-local config keys").
- Tools for a model it knows (e.g. gpt-5.5): `exec_command`, `write_stdin`, `apply_patch` (a
  freeform custom tool), `view_image`, `request_user_input`, goals, `tool_search`, and `web_search`
  unless `web_search="disabled"`. For an unknown model name it falls back to generic metadata
  (no `apply_patch`) with an `error` item as a warning.
- Policy: the image's `/etc/codex/requirements.toml` runs `forgehand-hook codex PreToolUse|PostToolUse`
  for every tool call (sandbox/images/agent_files.py has what Codex obeys); the bridge posts to
  `/hooks/codex/<event>` on the run's socket, answered here. A blocked call is absent from the
  JSON stream, so it is recorded here (tool call + error result) when it is refused.
- `codex exec ... resume THREAD_ID PROMPT` continues the thread (same id) in a fresh `CODEX_HOME`
  that holds only the saved `sessions/`.

Codex has no control channel in `exec` mode: a call parked for approval is refused with a message
that tells the model to stop, every later call of the run is refused, and a turn that still runs
`stop_grace` seconds later is killed (the run is blocked either way)."""

import json
from typing import Any

from sandbox import Relay, SandboxError
from sandbox.spec import GATEWAY_RELAY_PORT, HOME_DIR
from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason, RunState
from tasks.core.transcript import ToolCall, ToolResult
from tasks.run.gateway import SOCKET_NAME
from tasks.run.runtimes.agent_process import WORKDIR, run_agent
from tasks.run.runtimes.agent_session import HOME_CAP, AgentHome, keep, prompt_of, restore, scrub
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.codex.stream import Allowed, StreamState
from tasks.run.runtimes.codex.turn import CodexTurn
from tasks.run.runtimes.codex_config import PROVIDER, codex_settings, overrides, provider_fields, toml_value
from tasks.run.runtimes.policy_broker import PolicyBroker, hook_refusal
from tasks.run.runtimes.policy_steps import StopStep, after_tool
from tasks.run.runtimes.tool_kinds import tool_kind

AGENT_NAME = "codex"
CLI_PATH = "/usr/local/bin/codex"
# Only the sessions carry over; everything else in CODEX_HOME (a config.toml, hooks.json, rules the
# agent wrote from a shell call) is removed before each `codex exec`.
CODEX_HOME = AgentHome(
    label="Codex",
    archive="codex-home.tgz",
    path=".codex/sessions",
    scrub=(
        "mkdir -p .codex && if [ -L .codex/sessions ]; then rm -f .codex/sessions; fi && "
        "find .codex -mindepth 1 -maxdepth 1 ! -name sessions -exec rm -rf {} +"
    ),
)
RAW_CAP = 8 * 1024 * 1024  # the raw stream artefact of one run (head and tail kept)


def provider_config(base_url: str) -> str:
    """The `-c` value of forgehand's provider: the relay's URL, the run token as the bearer."""
    return f"model_providers.{PROVIDER}={toml_value(provider_fields(base_url))}"


class CodexRuntime:
    name = AGENT_NAME
    model_provider = "openai"  # the gateway route and key it spends (OpenAI Responses)

    def __init__(
        self,
        *,
        cli: str = CLI_PATH,
        idle_seconds: float = 300.0,
        linger_seconds: float = 10.0,
        stop_grace: float = 30.0,
        home_cap: int = HOME_CAP,
    ) -> None:
        self.cli = cli
        self.idle_seconds = idle_seconds  # stdout silent this long (beyond a tool's timeout): killed
        self.linger_seconds = linger_seconds  # alive this long after its turn ended: killed
        self.stop_grace = stop_grace  # a turn that goes on this long after a stopping refusal: killed
        self.home_cap = home_cap

    def needs_model(self) -> bool:
        return True

    def image_kind(self) -> str:
        return "agents"

    def relays(self) -> tuple[Relay, ...]:
        """Codex needs a TCP base URL: the sandbox relays 127.0.0.1:4100 to the gateway socket."""
        return (Relay(GATEWAY_RELAY_PORT, SOCKET_NAME),)

    def argv(self, ctx: RunContext, session: str, prompt: str) -> list[str]:
        channel = ctx.channel
        assert channel is not None
        argv = [
            self.cli,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "-C",
            WORKDIR,
            *overrides(codex_settings(allow_web_search=channel.provider.allow_web_search)),
        ]
        model = channel.provider.openai_model
        if model:
            argv += ["-m", model]
        if session:
            argv += ["resume", session]
        return [*argv, "--", prompt]

    async def run(self, ctx: RunContext) -> Outcome:
        channel = ctx.channel
        if channel is None:
            raise RuntimeUnavailable("no model gateway for this run", FailureReason.MODEL_UNREACHABLE)
        session = await restore(ctx, CODEX_HOME)
        version = await self._prepare(ctx)
        env = {
            "FORGEHAND_RUN_TOKEN": channel.token,
            "HOME": HOME_DIR,
            "CODEX_HOME": f"{HOME_DIR}/.codex",
            "NO_COLOR": "1",
        }
        raw = HeadTail(RAW_CAP)
        broker = PolicyBroker(ctx)  # no control channel to end a turn on (see CodexTurn)
        state = StreamState(version)
        hooks = _Hooks(ctx, broker, state)
        channel.set_hook_handler(hooks.on_hook)
        if ctx.backchannel is not None:
            ctx.backchannel.set_question_hook(broker.on_question)
        prompt = prompt_of(ctx, session)
        outcome: Outcome | None = None
        try:
            stop = StopStep(ctx)
            while True:  # a stop policy's model context continues the thread once (StopStep)
                turn = CodexTurn(self, ctx, broker, raw, state)
                argv = self.argv(ctx, session, prompt)
                outcome = await run_agent(
                    ctx, "codex", argv, env, prepare=lambda: scrub(ctx, CODEX_HOME), drive=turn.run
                )
                session = state.session_id or session
                if outcome.status is not RunState.SUCCEEDED:
                    break
                more = await stop.next_message(outcome.summary, turns=ctx.turns + state.completed)
                if not more or not session:
                    break
                prompt = more  # the consumer's word, as the thread's next message
        finally:
            ctx.agent_name = AGENT_NAME
            ctx.turns += state.completed
            ctx.prompt_tokens += state.input_tokens
            ctx.completion_tokens += state.output_tokens
            await keep(ctx, state, raw.text(), home_cap=self.home_cap, home=CODEX_HOME)
        assert outcome is not None
        return outcome

    async def _prepare(self, ctx: RunContext) -> str:
        """CODEX_HOME exists (a restored one already does) and the CLI's version, for the run."""
        script = f'mkdir -p "$HOME/.codex" && exec {self.cli} --version'
        try:
            result = await ctx.sandbox.exec(["sh", "-c", script], timeout=60, env={"HOME": HOME_DIR})
        except SandboxError as exc:
            raise RuntimeUnavailable(f"codex could not start: {exc}", FailureReason.INTERNAL) from exc
        words = result.stdout.decode(errors="replace").split()
        if not result.ok or not words:
            tail = result.stderr.decode(errors="replace")[-500:]
            raise RuntimeUnavailable(f"codex --version failed: {tail}", FailureReason.INTERNAL)
        return words[-1]


class _Hooks:
    """`POST /hooks/codex/<event>` from the image's managed hooks: the gate for every tool call."""

    def __init__(self, ctx: RunContext, broker: PolicyBroker, state: StreamState) -> None:
        self.ctx = ctx
        self.broker = broker
        self.state = state
        self.posted: set[str] = set()

    async def on_hook(self, agent: str, event: str, body: dict[str, Any]) -> dict[str, Any]:
        if agent != AGENT_NAME:
            return hook_refusal(event, f"forgehand: no {agent} agent in this run")
        name, tool_input = body.get("tool_name"), body.get("tool_input")
        call_id = str(body.get("tool_use_id") or "")
        if not isinstance(name, str) or not name:
            return hook_refusal(event, "forgehand: the hook input names no tool")
        if event == "PostToolUse":
            return await self._post(call_id, name, body.get("tool_response"))
        if event != "PreToolUse":
            return hook_refusal(event, f"forgehand does not serve {event}")
        verdict = await self.broker.decide(call_id, name, tool_input)
        if verdict.behavior == "deny":
            # Codex leaves a blocked call out of its stream: the transcript has it from here.
            await self.ctx.emit("tool_call", ToolCall(id=call_id, name=name, input=tool_input, kind=tool_kind(name)))
            await self.ctx.emit("tool_result", ToolResult(id=call_id, name=name, output=verdict.message, is_error=True))
            return {
                "hookSpecificOutput": {
                    "hookEventName": event,
                    "permissionDecision": "deny",
                    "permissionDecisionReason": verdict.message,
                }
            }
        out: dict[str, Any] = {"hookEventName": event, "permissionDecision": "allow"}
        runs = tool_input
        if verdict.updated_input is not None and verdict.updated_input != tool_input:
            out["updatedInput"] = runs = verdict.updated_input  # a consumer's rewrite: what runs
        self.state.allowed(Allowed(id=call_id, name=name, input=runs))
        return {"hookSpecificOutput": out}

    async def _post(self, call_id: str, name: str, response: Any) -> dict[str, Any]:
        if call_id and call_id not in self.posted and call_id in self.broker.allowed:
            self.posted.add(call_id)
            output = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            await after_tool(self.ctx, tool_use_id=call_id, tool_name=name, output=output, is_error=False)
        return {}
