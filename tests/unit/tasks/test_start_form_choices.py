"""The start form's runtime choices in words: what each is, how its tool calls are checked, and for
one that cannot run here the reason and where to fix it (who may fix it decides the link)."""

from tasks.core.agent_registry import AgentInfo
from tasks.http.pages.start_form import Place, acp_choices, runtime_choices
from tasks.services.agents import StartOptions


def info(
    runtime: str, layers: list[str], *, command: str = "", available: bool = True, provider: str = ""
) -> AgentInfo:
    return AgentInfo(
        runtime=runtime,
        agent_command=command,
        description=f"the {command or runtime} agent",
        version="1.0",
        image="img",
        available=available,
        policy_layers=layers,
        provider=provider,
    )


REGISTRY = [
    info("builtin", ["runner_loop"]),
    info("command", []),
    info("claude-code", ["control_channel", "managed_hooks"], provider="anthropic"),
    info("codex", ["managed_hooks"], available=False, provider="openai"),
    info("acp", ["permission_requests"], command="claude-agent-acp", provider="anthropic"),
    info("acp", ["managed_hooks"], command="codex-acp", provider="openai"),
]
RUNTIMES = ["acp", "builtin", "claude-code", "codex", "command"]


def options(no_model: dict[str, str], *, personal_keys: bool = False) -> StartOptions:
    return StartOptions(
        agents=["fixer"], runtimes=RUNTIMES, model_configured=False, no_model=no_model, personal_keys=personal_keys
    )


def test_without_models_only_the_command_can_run_and_each_says_why() -> None:
    missing = {"builtin": "x", "claude-code": "x", "codex": "x", "acp:anthropic": "x", "acp:openai": "x"}
    choices = {c.value: c for c in runtime_choices(options(missing), REGISTRY, Place(repo="ana/app", can_admin=True))}
    assert list(choices) == ["builtin", "claude-code", "codex", "acp", "command"]
    assert [v for v, c in choices.items() if c.ready] == ["command"]
    claude = choices["claude-code"]
    assert claude.reasons == ["It needs an Anthropic model, and none is set up here for you."]
    assert [(f.href, f.text) for f in claude.fixes] == [
        ("/ana/app/settings/tasks/#anthropic-settings", "Set an endpoint in the task settings")
    ]
    assert "the program asks forgehand before each tool call" in claude.checks
    assert "hooks locked into the sandbox image" in claude.checks
    assert len(choices["codex"].reasons) == 2 and "agents image" in choices["codex"].reasons[1]
    assert choices["acp"].reasons == [
        "None of its agents can run here (claude-agent-acp: no Anthropic model; codex-acp: no OpenAI-compatible model)."
    ]
    assert choices["command"].checks == "No tool calls to check."


def test_who_may_fix_a_missing_model_decides_the_link() -> None:
    writer = Place(repo="ana/app", can_admin=False)
    fixes = runtime_choices(options({"builtin": "x"}, personal_keys=True), REGISTRY, writer)[0].fixes
    assert [(f.href, f.text) for f in fixes] == [("/settings/model-keys/", "Add your own model key")]
    fixes = runtime_choices(options({"builtin": "x"}), REGISTRY, writer)[0].fixes
    assert [(f.href, f.text) for f in fixes] == [("", "A repository admin can set an endpoint in the task settings.")]


def test_an_acp_agent_with_a_model_can_run() -> None:
    agents = acp_choices(options({"acp:anthropic": "x"}), REGISTRY, Place(repo="ana/app", can_admin=True))
    assert [(a.value, a.ready) for a in agents] == [("claude-agent-acp", False), ("codex-acp", True)]
    assert "asks forgehand's permission" in agents[0].checks
