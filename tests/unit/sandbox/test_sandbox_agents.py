"""The agents image recipe: deploy/ copies match the package's, pins become labels, the managed
settings say what the contract says, and an npm that fails is a clear build error."""

import json
import os
import stat
import tomllib
from pathlib import Path

import pytest

from sandbox import AGENT_PINS, AgentPin, ImageBuildFailed
from sandbox.images.agent_files import (
    CODEX_REQUIREMENTS,
    HOOK_PATH,
    HOOK_SCRIPT,
    HOOK_TIMEOUT_SECONDS,
    MANAGED_SETTINGS,
)
from sandbox.images.agents_image import (
    AGENTS_DOCKERFILE,
    AGENTS_IMAGE_VERSION,
    DEFAULT_AGENTS_IMAGE,
    agent_labels,
    agents_from_labels,
    install_agent,
    npm_arch,
)
from sandbox.images.sandbox_image import DEFAULT_IMAGE
from sandbox.relays import RELAY_SCRIPT

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "sandbox" / "agents"


def test_deploy_copies_match_the_package() -> None:
    assert (DEPLOY / "Dockerfile").read_text() == AGENTS_DOCKERFILE
    assert (DEPLOY / "managed-settings.json").read_text() == MANAGED_SETTINGS
    assert (DEPLOY / "requirements.toml").read_text() == CODEX_REQUIREMENTS
    assert (DEPLOY / "bin" / "forgehand-hook").read_text() == HOOK_SCRIPT
    assert (DEPLOY / "bin" / "forgehand-relay").read_text() == RELAY_SCRIPT
    for script in ("forgehand-hook", "forgehand-relay"):
        assert (DEPLOY / "bin" / script).stat().st_mode & stat.S_IXUSR


def test_recipe_starts_from_the_sandbox_image_and_ends_as_the_sandbox_user() -> None:
    assert f"forgehand-sandbox-agents:{AGENTS_IMAGE_VERSION}" == DEFAULT_AGENTS_IMAGE
    assert f"ARG BASE={DEFAULT_IMAGE}\nFROM ${{BASE}}\n" in AGENTS_DOCKERFILE
    assert AGENTS_DOCKERFILE.rstrip().splitlines()[-3:] == [
        "USER 1000:1000",
        "WORKDIR /workspace",
        'CMD ["sleep", "infinity"]',
    ]
    # Nothing runs at build time, so nothing is fetched (and no layer stores the binaries twice).
    assert not [line for line in AGENTS_DOCKERFILE.splitlines() if line.startswith("RUN")]


def test_pins_are_labels_and_read_back() -> None:
    assert AGENT_PINS["claude-code"].version == "2.1.332"
    assert AGENT_PINS["claude-code"].npm == "@anthropic-ai/claude-code"
    labels = agent_labels()
    assert labels["org.forgehand.agent.claude-code"] == "2.1.332"
    assert labels["org.forgehand.agents.version"] == AGENTS_IMAGE_VERSION
    assert labels["org.forgehand.agent.codex"] == "0.171.0"
    assert agents_from_labels({**labels, "org.forgehand.sandbox.version": "1"}) == {
        "claude-code": "2.1.332",
        "codex": "0.171.0",
        "claude-agent-acp": "0.101.0",
        "codex-acp": "2.6.0",
    }
    # node and the adapters' own pinned dependencies are recorded too (not agents).
    assert labels["org.forgehand.runtime.node"] == "24.22.3"
    assert "@anthropic-ai/claude-agent-sdk@0.3.318" in labels["org.forgehand.acp.claude-agent-acp.dependencies"]
    assert "@openai/codex@0.171.0" in labels["org.forgehand.acp.codex-acp.dependencies"]


def test_codex_requirements_pin_the_managed_hooks_on() -> None:
    requirements = tomllib.loads(CODEX_REQUIREMENTS)
    assert requirements["allow_managed_hooks_only"] is True
    # hooks cannot be disabled; write_stdin (which no hook sees) has no TTY to type into
    assert requirements["features"] == {"hooks": True, "unified_exec_tty": False}
    assert requirements["mcp_servers"] == {"forgehand": {"identity": {"url": "http://127.0.0.1:4100/mcp"}}}
    for event in ("PreToolUse", "PostToolUse"):
        [entry] = requirements["hooks"][event]
        assert entry == {
            "matcher": "*",
            "hooks": [{"type": "command", "command": f"{HOOK_PATH} codex {event}", "timeout": 130}],
        }
    assert "COPY requirements.toml /etc/codex/requirements.toml\n" in AGENTS_DOCKERFILE


def test_managed_settings_lock_the_hooks_on() -> None:
    settings = json.loads(MANAGED_SETTINGS)
    assert settings["allowManagedHooksOnly"] is True
    assert settings["allowManagedPermissionRulesOnly"] is True
    assert settings["disableSkillShellExecution"] is True
    assert settings["disableAllHooks"] is False
    assert "permissions" not in settings  # forgehand decides, not a static rule list
    # What would make a hook (or any process of the agent) load code or data it did not choose, or
    # make the CLI start a hook, a tool or a process through a program of the agent's.
    pinned = ("LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT", "GCONV_PATH", "LOCPATH", "BASH_ENV", "ENV")
    claude = (
        "CLAUDE_CODE_SHELL_PREFIX",
        "CLAUDE_CODE_SHELL",
        "CLAUDE_CODE_PROCESS_WRAPPER",
        "CLAUDE_CODE_TEAMMATE_COMMAND",
    )
    claude += ("CLAUDE_CODE_PLUGIN_DIRS", "CLAUDE_CODE_PLUGIN_SEED_DIR", "CLAUDE_CODE_MESSAGING_SOCKET")
    claude += ("CLAUDE_CODE_MESSAGING_TOKEN", "CLAUDE_CODE_ENABLE_FUNCTION_HOOKS")
    assert settings["env"] == {
        **dict.fromkeys(pinned + claude, ""),
        "SHELL": "/bin/bash",
        "CLAUDE_CODE_EXPERIMENTAL_AGENT_TEAMS": "0",
        "CLAUDE_CODE_HARBOR_KITE": "0",  # the cross-session messaging inbox: off
    }
    for event in ("PreToolUse", "PostToolUse"):
        [entry] = settings["hooks"][event]
        assert entry["matcher"] == "*"
        [hook] = entry["hooks"]
        # Exec form: no shell (and so no shell prefix) between the CLI and the bridge.
        assert hook == {
            "type": "command",
            "command": HOOK_PATH,
            "args": ["claude", event],
            "timeout": 130,
            "onFailure": "block",
        }


def test_scripts_run_isolated_with_a_fixed_socket() -> None:
    assert HOOK_SCRIPT.startswith("#!/usr/bin/python3 -I\n")
    assert RELAY_SCRIPT.startswith("#!/usr/bin/python3 -I\n")
    assert 'SOCKET = "/run/forgehand/gateway.sock"' in HOOK_SCRIPT
    assert "TIMEOUT = 120" in HOOK_SCRIPT


def test_hook_bridge_file_is_python_with_the_settings_timeout() -> None:
    """The bridge is a file of the package (sandbox/images/forgehand-hook), not linted as a module:
    it compiles, and its own timeout is the one the managed settings add their margin to."""
    compile(HOOK_SCRIPT, "forgehand-hook", "exec")
    assert f"\nTIMEOUT = {HOOK_TIMEOUT_SECONDS}\n" in HOOK_SCRIPT


def test_machine_names_map_to_npm_cpu_names() -> None:
    assert npm_arch("x86_64") == "x64"
    assert npm_arch("aarch64") == "arm64"
    with pytest.raises(ImageBuildFailed):
        npm_arch("riscv64")


def _fake_npm(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir()
    npm = bin_dir / "npm"
    npm.write_text("#!/bin/sh\n" + script)
    npm.chmod(0o755)


PIN = AgentPin(npm="@example/agent", version="1.2.3", binary="@example/agent-linux-{arch}/agent", command="agent")


def test_install_fails_clearly_without_npm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ImageBuildFailed, match="npm is needed") as caught:
        install_agent("agent", PIN, arch="x64")
    assert "install Node.js" in str(caught.value)


def test_install_reports_a_refusing_registry_and_leaves_no_partial_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _fake_npm(
        tmp_path / "bin",
        "mkdir -p node_modules/junk\n"
        "echo 'npm error 404 Not Found - GET https://registry/@example%2fagent' >&2\n"
        "exit 1\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    with pytest.raises(ImageBuildFailed, match="404 Not Found"):
        install_agent("agent", PIN, arch="x64")
    assert list((tmp_path / "cache" / "forgehand" / "agents").iterdir()) == []


def test_install_is_cached_and_checks_the_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    _fake_npm(
        tmp_path / "bin",
        f'echo "$@" >> {calls}\n'
        "mkdir -p node_modules/@example/agent node_modules/@example/agent-linux-x64\n"
        'echo \'{"version": "1.2.3"}\' > node_modules/@example/agent/package.json\n'
        "printf '#!/bin/sh\\n' > node_modules/@example/agent-linux-x64/agent\n"
        "chmod 755 node_modules/@example/agent-linux-x64/agent\n",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}/usr/bin:/bin")
    first = install_agent("agent", PIN, arch="x64")
    second = install_agent("agent", PIN, arch="x64")
    assert (
        first == second == tmp_path / "cache/forgehand/agents/agent-1.2.3/node_modules/@example/agent-linux-x64/agent"
    )
    assert calls.read_text().splitlines() == [
        "install --no-audit --no-fund --ignore-scripts --no-save @example/agent@1.2.3"
    ]
    with pytest.raises(ImageBuildFailed, match=r"installed @example/agent@1\.2\.3, not the pinned 9\.9\.9"):
        install_agent(
            "agent", AgentPin(npm="@example/agent", version="9.9.9", binary=PIN.binary, command="agent"), arch="x64"
        )
