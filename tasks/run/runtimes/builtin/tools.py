"""The builtin runtime's tools as they run once allowed: `bash` in the sandbox, the file tools
through host-side safe access to the work tree, the back-channel's tools through its service (the
same one its MCP server calls). A problem is a `ToolError`, which the model is told."""

import asyncio
from pathlib import Path
from typing import Any

from sandbox import list_workspace, read_workspace_file, write_workspace_file
from tasks.core.capping import TOOL_OUTPUT_CAP, HeadTail
from tasks.run.backchannel import TOOL_NAMES as BACKCHANNEL_TOOLS
from tasks.run.backchannel import ToolRefused
from tasks.run.backchannel import call as call_tool
from tasks.run.runtimes.base import RunContext

MAX_FILE_BYTES = 4 * 1024 * 1024


class ToolError(Exception):
    pass


def str_arg(args: dict[str, Any], name: str, *, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    return value


async def execute(ctx: RunContext, name: str, args: dict[str, Any], extra: dict[str, Any]) -> str:
    root = Path(ctx.sandbox.spec.workspace)
    if name == "bash":
        command = str_arg(args, "command")
        buf = HeadTail(TOOL_OUTPUT_CAP)
        async with ctx.sandbox.stream(
            ["bash", "-lc", command], timeout=ctx.limits.tool_timeout, output_cap=64 * 1024 * 1024
        ) as running:
            async for chunk in running:
                buf.add(chunk.data)
        result = running.result
        status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return f"{status}\n{buf.text()}"
    if name == "read_file":
        data = await asyncio.to_thread(read_workspace_file, root, str_arg(args, "path"), MAX_FILE_BYTES)
        return data.decode("utf-8", "replace")
    if name == "write_file":
        path, content = str_arg(args, "path"), str_arg(args, "content")
        await asyncio.to_thread(write_workspace_file, root, path, content.encode(), MAX_FILE_BYTES)
        return f"wrote {len(content.encode())} bytes to {path}"
    if name == "edit_file":
        path = str_arg(args, "path")
        old, new = str_arg(args, "old_string"), str_arg(args, "new_string")
        if not old:
            raise ToolError("old_string must not be empty")
        text = (await asyncio.to_thread(read_workspace_file, root, path, MAX_FILE_BYTES)).decode("utf-8")
        count = text.count(old)
        if count != 1:
            raise ToolError(f"old_string occurs {count} times in {path}; it must occur exactly once")
        await asyncio.to_thread(write_workspace_file, root, path, text.replace(old, new).encode(), MAX_FILE_BYTES)
        return f"edited {path}"
    if name == "list_files":
        entries = await asyncio.to_thread(list_workspace, root, str_arg(args, "path", default=""))
        return "\n".join(f"{e.name}{'/' if e.kind == 'dir' else ''}" for e in entries) or "(empty)"
    custom = ctx.backchannel.custom if ctx.backchannel is not None else None
    if name in BACKCHANNEL_TOOLS or (custom is not None and custom.knows(name)):
        return await backchannel(ctx, name, args, extra)
    raise ToolError(f"unknown tool {name!r}")


async def backchannel(ctx: RunContext, name: str, args: dict[str, Any], extra: dict[str, Any]) -> str:
    """The back-channel's tools, through the same service as the MCP server's."""
    channel = ctx.backchannel
    if channel is None:
        raise ToolError("the back-channel is not available in this run")
    try:
        text = await call_tool(channel, name, args)
    except ToolRefused as exc:
        raise ToolError(str(exc).removeprefix("error: ")) from None
    if name == "ask_user" and channel.question is not None:
        extra["question"], extra["options"] = channel.question.text, channel.question.options
    elif name == "report_summary":
        extra["summary"] = channel.summary or ""
    return text
