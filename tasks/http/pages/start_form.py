"""The start form's choice of runtime, in a person's words: what each runtime is, which checks its
tool calls pass (its policy layers, docs/agents.md), and whether it can run here: a model to talk
to (asked as the start asks, `agents.missing_models`) and its program in the agents image. One that
cannot is offered disabled, with the reason and where to fix it."""

from collections.abc import Iterable

import msgspec

from tasks.core.agent_registry import AgentInfo
from tasks.services.agents import StartOptions

# What each runtime is: (name, what it does).
RUNTIME_WORDS: dict[str, tuple[str, str]] = {
    "builtin": (
        "forgehand's agent",
        "forgehand's own agent loop: it talks to the model endpoint set for this repository "
        "(OpenAI-compatible) and runs its tools in the sandbox.",
    ),
    "command": ("A command, no agent", "Runs the command you write below in the sandbox, once. No model is called."),
    "claude-code": (
        "Claude Code",
        "Anthropic's Claude Code command-line agent, working in the sandbox; it talks to an Anthropic endpoint.",
    ),
    "codex": (
        "Codex",
        "OpenAI's Codex command-line agent, working in the sandbox; it talks to an OpenAI-compatible "
        "endpoint (Responses API).",
    ),
    "acp": (
        "An ACP agent",
        "An agent program the instance's operator set up, which speaks the Agent Client Protocol; "
        "choose which one below.",
    ),
}
ORDER = ("builtin", "claude-code", "codex", "acp", "command")
# How each policy layer checks a tool call, in words.
LAYER_WORDS: dict[str, str] = {
    "runner_loop": "forgehand runs each tool call itself, after the check",
    "control_channel": "the program asks forgehand before each tool call",
    "managed_hooks": "hooks locked into the sandbox image ask forgehand before each tool call and block it "
    "when no answer comes",
    "permission_requests": "the agent asks forgehand's permission for the actions it asks about",
}
# The settings card that sets each model API's endpoint (ids in tasks/settings.html).
SETTINGS_CARD = {"openai": "model-settings", "anthropic": "anthropic-settings"}
PROVIDER_OF = {"builtin": "openai", "codex": "openai", "claude-code": "anthropic"}
# The model a runtime talks to, in words.
MODEL_WORDS = {"openai": "an OpenAI-compatible model", "anthropic": "an Anthropic model"}
IMAGE_MISSING = (
    "Its program is not in this instance's agents image (an operator adds it: forgehand sandbox build --agents)."
)


class Link(msgspec.Struct, kw_only=True):
    href: str  # "" = no page to go to: the text says who can fix it
    text: str


class Choice(msgspec.Struct, kw_only=True):
    """One runtime (or ACP agent) as the form offers it."""

    value: str
    title: str
    about: str
    checks: str
    version: str = ""
    reasons: list[str] = msgspec.field(default_factory=list)  # why it cannot run here (none: it can)
    fixes: list[Link] = msgspec.field(default_factory=list)
    short: list[str] = msgspec.field(default_factory=list)  # the reasons in a few words each

    @property
    def ready(self) -> bool:
        return not self.reasons


class Place(msgspec.Struct, kw_only=True):
    """Where the form is, for the links that fix a missing model."""

    repo: str  # owner/name
    can_admin: bool


def checks_text(layers: Iterable[str]) -> str:
    words = [LAYER_WORDS.get(layer, layer) for layer in layers]
    if not words:
        return "No tool calls to check."
    return "Your policy (policy endpoints, approvals) checks its tool calls: " + "; ".join(words) + "."


def model_fixes(provider: str, options: StartOptions, place: Place) -> list[Link]:
    fixes = []
    if place.can_admin:
        card = SETTINGS_CARD.get(provider, "model-settings")
        fixes.append(Link(href=f"/{place.repo}/settings/tasks/#{card}", text="Set an endpoint in the task settings"))
    if options.personal_keys:
        fixes.append(Link(href="/settings/model-keys/", text="Add your own model key"))
    if not fixes:
        fixes.append(Link(href="", text="A repository admin can set an endpoint in the task settings."))
    return fixes


def _no_model(choice: Choice, provider: str, options: StartOptions, place: Place) -> None:
    """The start would refuse it for want of a model (`options.no_model`): said plainly, with
    where to set one up (the start's own message names the settings for operators)."""
    what = MODEL_WORDS.get(provider, "a model")
    choice.reasons.append(f"It needs {what}, and none is set up here for you.")
    choice.short.append(f"no {what.removeprefix('an ').removeprefix('a ')}")
    choice.fixes = model_fixes(provider, options, place)


def _not_installed(choice: Choice, reason: str = "") -> None:
    choice.reasons.append(reason[:1].upper() + reason[1:] if reason else IMAGE_MISSING)
    choice.short.append(reason or "not in the agents image")


def runtime_choices(options: StartOptions, registry: list[AgentInfo], place: Place) -> list[Choice]:
    """Every runtime of the instance: the agents first, then the plain command."""
    info = {a.runtime: a for a in registry if a.runtime != "acp"}
    acp = acp_choices(options, registry, place)
    out: list[Choice] = []
    for runtime in sorted(options.runtimes, key=lambda r: (ORDER.index(r) if r in ORDER else len(ORDER), r)):
        if runtime == "acp" and not acp:
            continue
        title, about = RUNTIME_WORDS.get(runtime, (runtime, info[runtime].description if runtime in info else ""))
        agent = info.get(runtime)
        choice = Choice(
            value=runtime,
            title=title,
            about=about,
            checks="Each agent below says how its tool calls are checked."
            if runtime == "acp"
            else checks_text(agent.policy_layers if agent else ()),
            version=agent.version if agent else "",
        )
        if runtime in options.no_model:
            _no_model(choice, PROVIDER_OF.get(runtime, ""), options, place)
        if agent is not None and not agent.available:
            _not_installed(choice)
        if runtime == "acp" and not any(a.ready for a in acp):
            _none_ready(choice, acp)
        out.append(choice)
    return out


def _none_ready(choice: Choice, agents: list[Choice]) -> None:
    """The ACP runtime when none of its agents can run: their reasons and fixes, once each."""
    each = "; ".join(f"{a.value}: {', '.join(a.short)}" for a in agents)
    choice.reasons = [f"None of its agents can run here ({each})."]
    choice.fixes = list({f.text: f for a in agents for f in a.fixes}.values())


def acp_choices(options: StartOptions, registry: list[AgentInfo], place: Place) -> list[Choice]:
    """The ACP agents the operator configured (the shipped adapters included)."""
    out: list[Choice] = []
    for agent in (a for a in registry if a.runtime == "acp"):
        choice = Choice(
            value=agent.agent_command,
            title=agent.agent_command,
            about=agent.description or "An ACP agent the operator set up.",
            checks=checks_text(agent.policy_layers),
            version=agent.version,
        )
        if f"acp:{agent.provider}" in options.no_model:
            _no_model(choice, agent.provider, options, place)
        if agent.unavailable_reason or not agent.available:
            _not_installed(choice, agent.unavailable_reason)
        out.append(choice)
    return out
