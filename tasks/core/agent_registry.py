"""The agent registry (operator config): every runtime this instance can run, with its version, its
image and the policy layers that gate its tool calls, plus the ACP agents an operator configured.

ACP agents come from two places:
- the shipped configurations (`SHIPPED_ACP_AGENTS`: the Claude Code and Codex ACP adapters), each
  enabled when the agents image carries its adapter, i.e. when `forgehand sandbox build --agents`
  installed it (the image label `org.forgehand.agent.<package>`). Nothing is written next to the
  image: the labels are the record, so an image rebuilt without an adapter disables it at once;
- `FORGEHAND_ACP_AGENTS`, a TOML or JSON file `{"agents": [{name, command, image, description,
  provider, layers}]}` (TOML: `[[agents]]` tables). An entry with a shipped name replaces the
  shipped one. `image` "" means the agents image; an operator image is used as given (no label
  check: the operator vouches for it).

Pure: the versions come in as the agents image's labels (`installed`), read by the caller."""

import json
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

Provider = Literal["anthropic", "openai", "none"]
# The layers a runtime's tool calls pass (docs/agents.md says which actions each one sees):
# runner_loop: forgehand's own loop runs every tool call (builtin); control_channel: the CLI asks
# forgehand over stdio before a call (claude-code); managed_hooks: read-only hooks in the image call
# forgehand's bridge and block on any failure; permission_requests: ACP `session/request_permission`.
Layer = Literal["runner_loop", "control_channel", "managed_hooks", "permission_requests"]
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,39}$"

ACP_ROOT = "/opt/forgehand/acp"
NODE_PATH = "/usr/local/bin/node"


class AcpAgent(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(pattern=NAME_PATTERN)]
    command: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, max_length=65536)]], msgspec.Meta(min_length=1)]
    image: str = ""  # "" = the agents image
    description: str = ""
    # Which model API the agent speaks through the run's gateway ("none": it calls no model).
    provider: Provider = "anthropic"
    layers: tuple[Layer, ...] = ("permission_requests",)
    # The agents image label naming the adapter (`org.forgehand.agent.<package>`); shipped agents
    # only: "" for an operator's own agent.
    package: str = ""
    # Other agents the image must carry for it to work (e.g. the CLI the adapter drives).
    requires: tuple[str, ...] = ()
    # Environment the adapter needs besides the gateway's (e.g. the pinned CLI it should drive).
    env: dict[str, str] = msgspec.field(default_factory=dict)
    # Where under `$HOME` the agent keeps its sessions: carried from one run to the next (capped) so
    # `session/load` works; nothing else of `$HOME` carries over. Empty: every run starts afresh.
    session_paths: tuple[str, ...] = ()
    # Set when the configuration ships but cannot run yet: the reason, shown in the list; such an
    # agent is listed as unavailable and a task naming it is refused (`acp_agent_unavailable`).
    unavailable: str = ""
    # The CLI under the adapter whose managed hooks call back (`/hooks/<hooks>/...` on the run's
    # socket): answered through the same policy as the permission requests; "" = none (refused).
    hooks: Literal["", "claude", "codex"] = "claude"
    # forgehand writes Codex's configuration (the gateway as its model provider, tasks/run/runtimes/
    # codex_config.py) into `$CODEX_HOME` before each start: for an adapter that runs `codex app-server`.
    codex_config: bool = False
    # `_meta` of session/new and session/load: the adapter's own session options.
    session_meta: dict[str, Any] = msgspec.field(default_factory=dict)
    # Where in `session_meta` the run's turn limit goes (dotted path; "" = the agent takes none).
    turn_limit_key: str = ""


class _File(msgspec.Struct, forbid_unknown_fields=True):
    agents: list[AcpAgent] = msgspec.field(default_factory=list)


def adapter_entry(package: str) -> str:
    """Where the image keeps an adapter's entry point (sandbox/images/agents_image.py installs it there)."""
    return f"{ACP_ROOT}/{package}/node_modules/@agentclientprotocol/{package}/dist/index.js"


SHIPPED_ACP_AGENTS: dict[str, AcpAgent] = {
    "claude-agent-acp": AcpAgent(
        name="claude-agent-acp",
        command=[NODE_PATH, adapter_entry("claude-agent-acp")],
        description="Claude Code through its ACP adapter (@agentclientprotocol/claude-agent-acp)",
        provider="anthropic",
        # The adapter drives the image's pinned claude binary, so the managed settings and hooks in
        # /etc/claude-code apply to every tool call, reads included.
        layers=("permission_requests", "managed_hooks"),
        package="claude-agent-acp",
        # The session transcripts only (see tasks/run/runtimes/agent_session.py: CLAUDE_HOME).
        session_paths=(".claude/projects",),
        env={"CLAUDE_CODE_EXECUTABLE": "/usr/local/bin/claude", "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false"},
        # The adapter's SDK options (`_meta.claudeCode.options`, applied over its defaults): only the
        # user's settings, as the claude-code runtime (the adapter loads the repository's
        # .claude/settings.json by default), no MCP server from anywhere, and no predicted
        # follow-up prompt after each turn (a model call nobody reads).
        session_meta={
            "claudeCode": {"options": {"settingSources": ["user"], "strictMcpConfig": True, "promptSuggestions": False}}
        },
        turn_limit_key="claudeCode.options.maxTurns",
    ),
    "codex-acp": AcpAgent(
        name="codex-acp",
        command=[NODE_PATH, adapter_entry("codex-acp")],
        description="OpenAI Codex through its ACP adapter (@agentclientprotocol/codex-acp)",
        provider="openai",
        # Measured with codex-acp 2.6.0 and codex 0.171.0 (docs/agents.md): in full-access mode the
        # adapter asks no permission for shell commands, patches or reads; every one passes the
        # image's managed PreToolUse hook (/etc/codex/requirements.toml), answered by the ACP runtime.
        layers=("managed_hooks",),
        package="codex-acp",
        session_paths=(".codex/sessions",),
        # codex-acp runs `codex app-server`: the Codex runtime's pinned binary (and its managed
        # requirements.toml) in the image, not the adapter's own copy (left out at build time).
        requires=("codex",),
        # Full access: Codex's own sandbox (bubblewrap) cannot start in the hardened container (the
        # container is the sandbox, as `codex exec --dangerously-bypass-approvals-and-sandbox`); the
        # other modes run every command through it (each fails) and add an auto-review model call.
        env={"CODEX_PATH": "/usr/local/bin/codex", "INITIAL_AGENT_MODE": "agent-full-access", "NO_BROWSER": "1"},
        hooks="codex",
        codex_config=True,
    ),
}


class AgentInfo(msgspec.Struct, kw_only=True):
    """One runtime of the instance, as `GET /api/v1/agents` and the start form show it."""

    runtime: str  # the task's `runtime`
    agent_command: str  # for runtime "acp": the configured agent's name (else "")
    description: str
    version: str  # the CLI's or adapter's version in the image ("" = not an agent CLI, or unknown)
    image: str  # "plain" sandbox image, the agents image, or the operator's image
    available: bool  # the image holds it (a shipped ACP adapter, a CLI agent) or it needs no image check
    unavailable_reason: str = ""  # why a configuration that ships cannot run yet ("" = none)
    policy_layers: list[str]
    provider: str  # the model API it speaks through the gateway ("" = none)


class AgentList(msgspec.Struct, kw_only=True):
    agents: list[AgentInfo]


def session_meta(agent: AcpAgent, turn_limit: int) -> dict[str, Any]:
    """The `_meta` of the agent's session/new and session/load, with the run's turn limit."""
    meta: dict[str, Any] = json.loads(json.dumps(agent.session_meta))  # a copy, nested too
    if agent.turn_limit_key and turn_limit > 0:
        *parents, leaf = agent.turn_limit_key.split(".")
        node = meta
        for key in parents:
            child = node.get(key)
            node[key] = child if isinstance(child, dict) else {}
            node = node[key]
        node[leaf] = turn_limit
    return meta


def load_acp_agents(path: str) -> dict[str, AcpAgent]:
    """The operator's ACP agents (`FORGEHAND_ACP_AGENTS`); ValueError names what is wrong."""
    if not path:
        return {}
    file = Path(path)
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise ValueError(f"FORGEHAND_ACP_AGENTS: cannot read {path}: {exc.strerror}") from None
    try:
        data: Any = tomllib.loads(raw.decode()) if file.suffix == ".toml" else json.loads(raw)
        agents = msgspec.convert(data, _File).agents
    except (ValueError, UnicodeDecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"FORGEHAND_ACP_AGENTS: {path} is not an agent list: {exc}") from None
    out: dict[str, AcpAgent] = {}
    for agent in agents:
        if agent.name in out:
            raise ValueError(f"FORGEHAND_ACP_AGENTS: {path} names {agent.name!r} twice")
        if any("\x00" in a for a in agent.command):
            raise ValueError(f"FORGEHAND_ACP_AGENTS: {path}: the command of {agent.name!r} contains NUL")
        out[agent.name] = agent
    return out


def acp_agents(path: str, installed: Mapping[str, str] | None = None) -> dict[str, AcpAgent]:
    """The ACP agents a task may name: the shipped ones the agents image carries (all of them when
    `installed` is None: the start check cannot wait for the engine, the run checks the image) and
    the operator's."""
    shipped = {
        name: agent for name, agent in SHIPPED_ACP_AGENTS.items() if installed is None or agent.package in installed
    }
    return {**shipped, **load_acp_agents(path)}


def acp_agent(path: str, name: str) -> AcpAgent | None:
    """The configured ACP agent `name`, or None."""
    return acp_agents(path).get(name)


# The other runtimes: what they are and which layers gate their tool calls.
_RUNTIMES: dict[str, tuple[str, str, tuple[Layer, ...], str]] = {
    # name: (description, image kind, layers, provider)
    "builtin": ("forgehand's agent loop on the host; tools run in the sandbox", "plain", ("runner_loop",), "openai"),
    "command": ("one command in the sandbox, no model and no tool calls", "plain", (), ""),
    "claude-code": ("the Claude Code CLI", "agents", ("control_channel", "managed_hooks"), "anthropic"),
    "codex": ("the OpenAI Codex CLI (codex exec)", "agents", ("managed_hooks",), "openai"),
}


def registry(
    runtimes: Iterable[str],
    installed: Mapping[str, str],
    *,
    acp_path: str,
    plain_image: str,
    agents_image: str,
) -> list[AgentInfo]:
    """Every runtime of the instance (the names in `runtimes`), ACP agents one entry each.
    `installed` is the agents image's agent labels (name -> version); {} when it is missing."""
    out: list[AgentInfo] = []
    for runtime in sorted(runtimes):
        if runtime == "acp":
            continue
        description, kind, layers, provider = _RUNTIMES.get(runtime, (runtime, "plain", (), ""))
        is_agent = kind == "agents"
        out.append(
            AgentInfo(
                runtime=runtime,
                agent_command="",
                description=description,
                version=installed.get(runtime, "") if is_agent else "",
                image=agents_image if is_agent else plain_image,
                available=runtime in installed if is_agent else True,
                policy_layers=list(layers),
                provider=provider,
            )
        )
    if "acp" in runtimes:
        try:
            configured = acp_agents(acp_path)
        except ValueError:
            configured = dict(SHIPPED_ACP_AGENTS)  # a broken file shows as no operator agents
        for name, agent in sorted(configured.items()):
            own_image = bool(agent.image)
            out.append(
                AgentInfo(
                    runtime="acp",
                    agent_command=name,
                    description=agent.description,
                    version=installed.get(agent.package, "") if agent.package else "",
                    image=agent.image or agents_image,
                    available=not agent.unavailable
                    and (own_image or all(p in installed for p in (agent.package, *agent.requires) if p)),
                    unavailable_reason=agent.unavailable,
                    policy_layers=list(agent.layers),
                    provider="" if agent.provider == "none" else agent.provider,
                )
            )
    return out
