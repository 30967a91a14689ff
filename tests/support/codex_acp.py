"""For tests of the shipped `codex-acp` agent (the Codex ACP adapter driving `codex app-server` in
the agents image): a scripted Responses server that answers the adapter's own title request (a
request without tools, for a model of Codex's choosing) outside the script, so the script holds
only the agent's turns; and what the model was told of each tool call."""

from typing import Any

from tests.support.openai_responses import ScriptedResponses, Turn, text

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


def told(api: ScriptedResponses) -> dict[str, str]:
    """What the model was told of each call (call id -> output), from the requests it got."""
    out: dict[str, str] = {}
    for body in api.requests:
        for item in body.get("input") or []:
            if item.get("type") in ("function_call_output", "custom_tool_call_output"):
                out[item["call_id"]] = str(item.get("output"))
    return out
