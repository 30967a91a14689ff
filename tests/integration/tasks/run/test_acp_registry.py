"""The agent registry: the operator's FORGEHAND_ACP_AGENTS file beside the shipped adapters,
`GET /api/v1/agents` for any signed-in caller, the start form's ACP agent list, and
`"runtime": "acp"` validated at the start (real database, real app)."""

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from litestar import Litestar
from litestar.testing import AsyncTestClient

from forge.core.settings import Settings
from tasks.core.agent_registry import SHIPPED_ACP_AGENTS, acp_agents, load_acp_agents, registry, session_meta
from tests.support.acp_agent import argv
from tests.support.forms import read_form
from tests.support.tasks import seed
from tests.support.web import csrf_from, sign_in

TASKS = "/api/v1/repos/ana/demo/tasks"
OPERATOR_TOML = """\
[[agents]]
name = "scripted"
command = ["python3", "-c", "print(1)"]
image = "example/own-agent:1"
description = "an operator's agent"
provider = "none"
layers = ["permission_requests"]
"""


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    path = tmp_path / "acp-agents.toml"
    path.write_text(OPERATOR_TOML)
    return msgspec.structs.replace(settings, acp_agents=str(path))


def test_the_file_is_read_as_toml_or_json_and_bad_files_name_what_is_wrong(tmp_path: Path) -> None:
    toml = tmp_path / "a.toml"
    toml.write_text(OPERATOR_TOML)
    as_json = tmp_path / "a.json"
    as_json.write_text(json.dumps({"agents": [{"name": "scripted", "command": argv({"turns": [[]]})}]}))
    assert load_acp_agents(str(toml))["scripted"].image == "example/own-agent:1"
    assert load_acp_agents(str(as_json))["scripted"].provider == "anthropic"
    # The shipped adapters are there unless the image lacks them; the operator's come on top.
    assert set(acp_agents(str(toml))) == {"claude-agent-acp", "codex-acp", "scripted"}
    assert set(acp_agents(str(toml), {"claude-agent-acp": "0.101.0"})) == {"claude-agent-acp", "scripted"}
    for body, what in (
        ('{"agents": [{"name": "Bad Name", "command": ["x"]}]}', "name"),
        ('{"agents": [{"name": "a", "command": []}]}', "command"),
        ('{"agents": [{"name": "a", "command": ["x"], "secret": 1}]}', "secret"),
        ('{"agents": [{"name": "a", "command": ["x"]}, {"name": "a", "command": ["y"]}]}', "twice"),
        ("not json", "not an agent list"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(body)
        with pytest.raises(ValueError, match=what):
            load_acp_agents(str(bad))
    with pytest.raises(ValueError, match="cannot read"):
        load_acp_agents(str(tmp_path / "missing.json"))


def test_the_run_s_turn_limit_goes_into_the_adapter_s_session_options() -> None:
    claude = SHIPPED_ACP_AGENTS["claude-agent-acp"]
    meta = session_meta(claude, 7)
    assert meta["claudeCode"]["options"]["maxTurns"] == 7
    assert meta["claudeCode"]["options"]["settingSources"] == ["user"]
    assert "maxTurns" not in claude.session_meta["claudeCode"]["options"]  # the config is not changed
    assert session_meta(SHIPPED_ACP_AGENTS["codex-acp"], 7) == {}


def test_the_registry_lists_every_runtime_with_version_image_and_layers(tmp_path: Path) -> None:
    toml = tmp_path / "a.toml"
    toml.write_text(OPERATOR_TOML)
    installed = {"claude-code": "2.1.332", "claude-agent-acp": "0.101.0"}
    runtimes = ("builtin", "command", "claude-code", "acp")
    agents = registry(runtimes, installed, acp_path=str(toml), plain_image="plain:1", agents_image="agents:3")
    listed = {(a.runtime, a.agent_command): a for a in agents}
    assert set(listed) == {
        ("builtin", ""), ("command", ""), ("claude-code", ""),
        ("acp", "claude-agent-acp"), ("acp", "codex-acp"), ("acp", "scripted"),
    }  # fmt: skip
    claude = listed[("claude-code", "")]
    assert (claude.version, claude.image, claude.available) == ("2.1.332", "agents:3", True)
    assert claude.policy_layers == ["control_channel", "managed_hooks"]
    adapter = listed[("acp", "claude-agent-acp")]
    assert (adapter.version, adapter.available, adapter.provider) == ("0.101.0", True, "anthropic")
    assert adapter.policy_layers == ["permission_requests", "managed_hooks"]
    codex = listed[("acp", "codex-acp")]
    assert (codex.version, codex.available) == ("", False)  # the image has no codex-acp
    own = listed[("acp", "scripted")]
    assert (own.image, own.available, own.provider) == ("example/own-agent:1", True, "")
    assert listed[("builtin", "")].image == "plain:1"


def test_codex_acp_is_available_when_the_agents_image_has_the_adapter_and_the_codex_it_drives() -> None:
    def listed(installed: dict[str, str]) -> Any:
        agents = registry(("acp",), installed, acp_path="", plain_image="plain:1", agents_image="agents:5")
        return next(a for a in agents if a.agent_command == "codex-acp")

    codex_acp = listed({"codex": "0.171.0", "codex-acp": "2.6.0"})
    assert (codex_acp.version, codex_acp.available, codex_acp.unavailable_reason) == ("2.6.0", True, "")
    assert (codex_acp.provider, codex_acp.policy_layers, codex_acp.image) == ("openai", ["managed_hooks"], "agents:5")
    assert listed({"codex-acp": "2.6.0"}).available is False  # no codex for its app-server
    shipped = SHIPPED_ACP_AGENTS["codex-acp"]
    assert (shipped.hooks, shipped.codex_config, shipped.unavailable) == ("codex", True, "")
    assert shipped.env["INITIAL_AGENT_MODE"] == "agent-full-access"


async def test_get_agents_needs_a_sign_in_and_lists_the_acp_agents(
    client: AsyncTestClient[Litestar], settings: Settings
) -> None:
    token, _ = await seed(settings)
    r = await client.get("/api/v1/agents")
    assert r.status_code == 401
    r = await client.get("/api/v1/agents", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    agents = r.json()["agents"]
    names = {(a["runtime"], a["agent_command"]) for a in agents}
    assert {("builtin", ""), ("command", ""), ("claude-code", ""), ("acp", "scripted")} <= names
    assert {("acp", name) for name in SHIPPED_ACP_AGENTS} <= names
    scripted = next(a for a in agents if a["agent_command"] == "scripted")
    assert scripted["policy_layers"] == ["permission_requests"] and scripted["image"] == "example/own-agent:1"


async def test_an_acp_start_names_a_configured_agent(client: AsyncTestClient[Litestar], settings: Settings) -> None:
    token, _ = await seed(settings)
    h = {"Authorization": f"Bearer {token}"}
    for bad, code in (
        ({"runtime": "acp"}, "agent_command_required"),
        ({"runtime": "acp", "agent_command": "nobody"}, "unknown_acp_agent"),
        ({"runtime": "builtin", "agent_command": "scripted"}, "invalid_agent_command"),
        ({"runtime": "acp", "agent_command": "claude-agent-acp"}, "model_not_configured"),
    ):
        r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", **bad}, headers=h)
        assert r.status_code == 422 and r.json()["code"] == code, (bad, r.text)
    r = await client.post(TASKS, json={"goal": "g", "agent": "fixer", "runtime": "acp", "agent_command": "scripted"},
                          headers=h)  # fmt: skip
    assert r.status_code == 201, r.text
    assert (r.json()["runtime"], r.json()["agent_command"]) == ("acp", "scripted")


async def test_the_start_form_offers_the_acp_agents(client: AsyncTestClient[Litestar], settings: Settings) -> None:
    await seed(settings)
    await sign_in(client, "ana", "correct horse battery")
    page = (await client.get("/ana/demo/tasks/")).text
    form = read_form(page)
    # One radio per agent, each saying in words what it is and how its tool calls are checked.
    assert form["agent_command-scripted"].attrs["name"] == "agent_command"
    assert "an operator's agent" in form["agent_command-scripted-about"].text
    claude = " ".join(form["agent_command-claude-agent-acp-about"].text.split())
    assert "the agent asks forgehand's permission" in claude and "hooks locked into the sandbox image" in claude
    assert "gated by" not in page and "permission_requests" not in page
    # The operator's agent calls no model: it can run; the Claude adapter needs one (none here).
    assert "disabled" not in form["agent_command-scripted"].attrs and "disabled" not in form["runtime-acp"].attrs
    assert "Anthropic model" in form["agent_command-claude-agent-acp-why"].text
    # Started from the form: the agent chosen there is the task's.
    form = {"goal": "from the form", "agent": "fixer", "runtime": "acp", "agent_command": "scripted"}
    start = page[page.index('id="start-form"') :]
    r = await client.post("/ana/demo/tasks/", data={**form, "csrf_token": csrf_from(start)}, follow_redirects=False)
    assert r.status_code == 303, r.text
    r = await client.post("/ana/demo/tasks/", data={**form, "agent_command": "nobody", "csrf_token": csrf_from(start)})
    assert r.status_code == 422 and "no ACP agent named" in r.text
