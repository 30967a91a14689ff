"""How an agent inside the sandbox reaches its run's back-channel: the MCP server on the run's
gateway socket, which the sandbox's gateway relay serves on the container's own loopback
(`127.0.0.1:GATEWAY_RELAY_PORT`), with the run token as the bearer. Runtimes hand this to their
agent's MCP configuration (claude-code's `--mcp-config`, codex, ACP)."""

import json
from typing import Any, Protocol

from sandbox import GATEWAY_RELAY_PORT
from tasks.run.backchannel.mcp import MCP_PATH, SERVER_NAME


class HasToken(Protocol):
    @property
    def token(self) -> str: ...


def mcp_url() -> str:
    return f"http://127.0.0.1:{GATEWAY_RELAY_PORT}{MCP_PATH}"


def mcp_client_config(channel: HasToken) -> dict[str, Any]:
    """`{"name", "url", "headers"}`: the streamable HTTP server of the run, as an MCP client needs it."""
    return {"name": SERVER_NAME, "url": mcp_url(), "headers": {"Authorization": f"Bearer {channel.token}"}}


TOKEN_VARIABLE = "FORGEHAND_RUN_TOKEN"  # what the CLI runtimes put the run token in


def claude_mcp_config(channel: HasToken) -> str:
    """Claude Code's `--mcp-config` JSON: the back-channel as its only MCP server. The token is
    left to the CLI's `${VAR}` expansion from its environment, so it is not on the command line
    (where `docker exec` records and `ps` show it)."""
    found = mcp_client_config(channel)
    headers = {"Authorization": f"Bearer ${{{TOKEN_VARIABLE}}}"}
    return json.dumps({"mcpServers": {found["name"]: {"type": "http", "url": found["url"], "headers": headers}}})
