"""For tests of the shipped `codex-acp` agent (the Codex ACP adapter driving `codex app-server` in
the agents image): a scripted Responses server that answers the adapter's own title request (a
request without tools, for a model of Codex's choosing) outside the script, so the script holds
only the agent's turns; the turn of a shell call and the settings that point a served instance's
OpenAI-compatible provider at a scripted server (for the codex and codex-acp task tests)."""

from typing import Any

import msgspec

from forge.core.settings import Settings
from tests.support.codex import add_file
from tests.support.openai_responses import ScriptedResponses, Turn, custom_tool_call, function_call, text

CODEX_ACP = {"agent": "fixer", "runtime": "acp", "agent_command": "codex-acp"}


class CodexAcpResponses(ScriptedResponses):
    def turn_for(self, body: dict[str, Any]) -> Turn:
        if not body.get("tools"):
            return text("A session title")
        return self.next_turn()

    @property
    def agent_requests(self) -> list[dict[str, Any]]:
        """The agent's own model calls (with tools), in order."""
        return [b for b in self.requests if b.get("tools")]


def exec_command(cmd: str, call_id: str) -> Turn:
    """A model turn calling Codex's shell tool."""
    return function_call("exec_command", {"cmd": cmd}, call_id)


def three_cycles() -> list[Turn]:
    """A script for three review cycles on hi.txt (v1 by apply_patch, then v2 and v3 by the shell),
    each ending with a text turn."""
    return [
        custom_tool_call("apply_patch", add_file("/workspace/hi.txt", "v1"), "call_v1"),
        text("first"),
        exec_command("echo v2 > /workspace/hi.txt", "call_v2"),
        text("second"),
        exec_command("echo v3 > /workspace/hi.txt", "call_v3"),
        text("third"),
    ]


def with_model(s: Settings, api: ScriptedResponses, *, key: str, model: str = "gpt-5.5") -> Settings:
    """`s` with the instance's OpenAI-compatible provider at `api` (gpt-5.5: Codex offers apply_patch)."""
    return msgspec.structs.replace(s, model_base_url=api.url, model_api_key=key, model_name=model)


def key_scan(key: str) -> str:
    """A shell command that counts where `key` shows in the sandbox (process environments, the
    workspace and $HOME, its own env) and prints `environ=N files=N env=N`; its own command line
    holds the key only in two halves."""
    half = len(key) // 2
    return (
        f'k="{key[:half]}""{key[half:]}"; '
        'n=$(grep -l -a -F -- "$k" /proc/[0-9]*/environ 2>/dev/null | wc -l); '
        'w=$(grep -r -l -a -F -- "$k" /workspace "$HOME" 2>/dev/null | wc -l); '
        'e=$(env | grep -c -F -- "$k"); echo "environ=$n files=$w env=$e"'
    )
