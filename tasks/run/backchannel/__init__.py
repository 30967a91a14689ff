"""The agent back-channel (docs/backchannel.md): per run, an MCP server on the run's gateway
socket (`mcp`), whose tools (`tools`) are the run's `Backchannel` (`service`): ask_user,
report_summary, record_progress, spawn_subtask, and for review tasks submit_review (`review`).
The builtin runtime offers the same tools as function tools; CLI agents get `mcp_client_config`
(`config`)."""

from tasks.run.backchannel.config import claude_mcp_config, mcp_client_config, mcp_url
from tasks.run.backchannel.mcp import MCP_PATH, SERVER_NAME, attach, attached, serve_mcp
from tasks.run.backchannel.service import Backchannel, Question, ToolRefused
from tasks.run.backchannel.tools import (
    PROPOSE_TOOL,
    REVIEW_TOOLS,
    TOOL_NAMES,
    TOOLS,
    ToolSpec,
    call,
    custom_specs,
    tools_for,
)

__all__ = [
    "MCP_PATH",
    "PROPOSE_TOOL",
    "REVIEW_TOOLS",
    "SERVER_NAME",
    "TOOLS",
    "TOOL_NAMES",
    "Backchannel",
    "Question",
    "ToolRefused",
    "ToolSpec",
    "attach",
    "attached",
    "call",
    "claude_mcp_config",
    "custom_specs",
    "mcp_client_config",
    "mcp_url",
    "serve_mcp",
    "tools_for",
]
