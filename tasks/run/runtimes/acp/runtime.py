"""The `acp` runtime: an operator-configured agent that speaks the Agent Client Protocol on its
stdio, inside the sandbox, with forgehand as the ACP client (docs/design.md, "Agents are untrusted"; the
operator's view is docs/agents.md "ACP agents"). A task names the agent (`agent_command`, the
registry in tasks/core/agent_registry.py); `AcpRuntime.for_task` binds it for one run. The
JSON-RPC client is forgehand's own (rpc.py says why not PyPI `agent-client-protocol`).

One run: `initialize` (no `fs`, no `terminal`: the agent acts itself, inside the sandbox, where
the managed hooks see it), `session/load` of the task's session when the agent can load, else
`session/new`, then `session/prompt`. `session/update` becomes transcript events
(updates.py). `session/request_permission` becomes `pre_tool_use` (name, kind, exact
`rawInput`) through the CLI runtimes' `PolicyBroker` (../policy_broker.py), shared with the
managed hook (one dispatch per tool call id); the option is picked by kind (`choose_option`);
`ask` parks the call and cancels the turn. A stop sends `session/cancel` and answers open requests `cancelled`. Odd
input is decided safely and never crashes the run (tests/integration/tasks/run/test_acp_protocol.py)."""

import json
from typing import Any

from forge.core.settings import Settings
from sandbox.spec import HOME_DIR
from tasks.core.agent_registry import AcpAgent, acp_agent
from tasks.core.states import FailureReason
from tasks.run.runtimes.acp.drive import Drive
from tasks.run.runtimes.acp.session import home_of, keep, restore
from tasks.run.runtimes.agent_process import run_agent
from tasks.run.runtimes.agent_session import prompt_of, scrub
from tasks.run.runtimes.base import Outcome, RunContext, RuntimeUnavailable
from tasks.run.runtimes.codex_config import codex_settings, config_toml, nested, write_config
from tasks.run.runtimes.ledger import ANNOUNCE_WAIT


class AcpRuntime:
    """The `acp` entry of RUNTIMES: unbound; `for_task` gives the runtime of one run."""

    name = "acp"

    def __init__(self, *, agents_path: str | None = None, idle_seconds: float = 300.0) -> None:
        self.agents_path = agents_path  # None = the instance's FORGEHAND_ACP_AGENTS
        self.idle_seconds = idle_seconds

    def needs_model(self) -> bool:
        return True

    def for_task(self, command: Any, settings: Settings) -> "AcpAgentRuntime":
        name = command if isinstance(command, str) else ""
        path = settings.acp_agents if self.agents_path is None else self.agents_path
        try:
            agent = acp_agent(path, name)
        except ValueError as exc:
            raise RuntimeUnavailable(str(exc), FailureReason.INTERNAL) from None
        if agent is None:
            raise RuntimeUnavailable(f"no ACP agent named {name!r} is configured", FailureReason.INTERNAL)
        return AcpAgentRuntime(agent, idle_seconds=self.idle_seconds)

    async def run(self, ctx: RunContext) -> Outcome:
        raise RuntimeUnavailable("the acp runtime runs a configured agent (agent_command)", FailureReason.INTERNAL)


class AcpAgentRuntime:
    """One configured ACP agent, for one run."""

    name = "acp"

    def __init__(self, agent: AcpAgent, *, idle_seconds: float = 300.0, announce_wait: float = ANNOUNCE_WAIT) -> None:
        self.agent = agent
        self.idle_seconds = idle_seconds
        self.announce_wait = announce_wait  # a Claude hook call waits this long for the adapter's report
        self.model_provider = "openai" if agent.provider == "openai" else "anthropic"
        self.image = agent.image  # "" = the agents image
        self.agent_label = agent.package  # the agents image must carry it ("" = no label check)
        self._drive: Drive | None = None

    def needs_model(self) -> bool:
        return self.agent.provider != "none"

    def image_kind(self) -> str:
        return "agents"

    async def stopping(self) -> None:
        """The run is being stopped: cancel the turn the ACP way before the sandbox goes."""
        if self._drive is not None:
            await self._drive.cancel()

    def env(self, ctx: RunContext) -> dict[str, str]:
        env = {"HOME": HOME_DIR, **self.agent.env}
        channel = ctx.channel
        if channel is None:
            return env
        env["FORGEHAND_RUN_TOKEN"] = channel.token
        if self.agent.provider == "anthropic":
            env.update(
                ANTHROPIC_BASE_URL="http://localhost",
                ANTHROPIC_UNIX_SOCKET=channel.container_socket,
                ANTHROPIC_AUTH_TOKEN=channel.token,
                CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
                DISABLE_AUTOUPDATER="1",
                CLAUDE_CODE_MAX_RETRIES="4",
            )
            if channel.provider.anthropic_model:
                env["ANTHROPIC_MODEL"] = channel.provider.anthropic_model
        if self.agent.codex_config:
            # The same settings as the config file, as the adapter's session config: they outrank
            # a repository's `.codex/config.toml` (the adapter trusts the session's project).
            model = channel.provider.openai_model
            config = nested(self.codex_settings(ctx), model=model)
            env.update(CODEX_HOME=f"{HOME_DIR}/.codex", CODEX_CONFIG=json.dumps(config))
        return env

    def codex_settings(self, ctx: RunContext) -> list[tuple[str, Any]]:
        allow = ctx.channel is not None and ctx.channel.provider.allow_web_search
        return codex_settings(allow_web_search=bool(allow))

    async def run(self, ctx: RunContext) -> Outcome:
        if self.agent.provider != "none" and ctx.channel is None:
            raise RuntimeUnavailable("no model gateway for this run", FailureReason.MODEL_UNREACHABLE)
        session = await restore(ctx, self.agent)
        drive = Drive(self, ctx, session)
        self._drive = drive
        if ctx.channel is not None:
            ctx.channel.set_hook_handler(drive.policy.on_hook)
        if ctx.backchannel is not None:
            ctx.backchannel.set_question_hook(drive.broker.on_question)

        async def prepare() -> None:
            await scrub(ctx, home_of(self.agent))
            if self.agent.codex_config and ctx.channel is not None:
                await write_config(ctx, config_toml(self.codex_settings(ctx), model=ctx.channel.provider.openai_model))

        async def kept() -> None:
            ctx.agent_name = self.agent.name
            ctx.agent_session_id = drive.session or ctx.agent_session_id
            ctx.agent_version = drive.version or ctx.agent_version
            await keep(ctx, self.agent, drive.session, drive.raw.text())

        return await run_agent(
            ctx,
            self.agent.name,
            list(self.agent.command),
            self.env(ctx),
            prepare=prepare,
            drive=lambda proc: drive.run(proc, prompt_of(ctx, session)),
            after=kept,
        )
