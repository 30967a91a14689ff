"""The back-channel's MCP server: Streamable HTTP (MCP 2025-06-18 and later, 2025-03-26 and
2024-11-05 clients too) at `/mcp` on the run's gateway socket, behind the gateway's token check
(tasks/run/gateway/routes.py answers 401 before anything here runs, and 405 to anything but POST:
this server offers no SSE stream to GET and no session to DELETE, which the transport allows).

Written here rather than with the `mcp` SDK's server: the SDK's Streamable HTTP manager is an
application of its own that needs a task group for its whole life and brings Starlette, pydantic,
jsonschema and OpenTelemetry into the runtime, for five methods (`initialize`,
`notifications/initialized`, `ping`, `tools/list`, `tools/call`) that each answer one JSON object
(the transport lets a server answer a POST with `application/json` instead of a stream). The
server asks the client nothing (no sampling, no elicitation): `ask_user` blocks the task, not the
call. It is stateless: no `Mcp-Session-Id`; every request is the token's run."""

import json
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from tasks.run.backchannel.service import Backchannel, ToolRefused
from tasks.run.backchannel.tools import call, tools_for

log = structlog.get_logger("forgehand.backchannel")

MCP_PATH = "/mcp"
SERVER_NAME = "forgehand"
SERVER_VERSION = "1"
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")  # newest first
INSTRUCTIONS = (
    "forgehand's back-channel for this task: ask_user to ask the person a question (then stop), "
    "report_summary once when done, record_progress for short notes, spawn_subtask to hand off a "
    "separate piece of work."
)

Send = Callable[[dict[str, Any]], Awaitable[None]]

# JSON-RPC 2.0 error codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

_ATTACHED: "weakref.WeakKeyDictionary[object, Backchannel]" = weakref.WeakKeyDictionary()


def attach(channel: object, backchannel: Backchannel) -> None:
    """Serve `backchannel` on `channel`'s socket (the run's gateway), for as long as both live."""
    _ATTACHED[channel] = backchannel


def attached(channel: object) -> Backchannel | None:
    return _ATTACHED.get(channel)


async def _answer(send: Send, status: int, body: Any = None, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    data = b"" if body is None else json.dumps(body, ensure_ascii=False).encode()
    out = [(b"content-length", str(len(data)).encode()), *(headers or [])]
    if body is not None:
        out.append((b"content-type", b"application/json"))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": data})


def _error(id_: Any, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": {"code": code, "message": message}}


def _result(id_: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def _local_origin(origin: str) -> bool:
    """Only a page of the sandbox's own loopback may call (DNS rebinding: the transport's rule)."""
    if origin in ("", "null"):
        return True
    host = origin.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0].strip("[]").lower()
    return host in ("127.0.0.1", "localhost", "::1")


def _initialize(params: dict[str, Any]) -> dict[str, Any]:
    asked = params.get("protocolVersion")
    version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
    return {
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": False}},
        "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
        "instructions": INSTRUCTIONS,
    }


def _tools(backchannel: Backchannel) -> dict[str, Any]:
    offered = tools_for(backchannel)
    return {"tools": [{"name": t.name, "description": t.description, "inputSchema": t.input_schema} for t in offered]}


async def _tool_call(backchannel: Backchannel, id_: Any, params: dict[str, Any]) -> dict[str, Any]:
    name = params.get("name")
    args = params.get("arguments") or {}
    names = {t.name for t in tools_for(backchannel)}
    if not isinstance(name, str) or name not in names:
        return _error(id_, INVALID_PARAMS, f"unknown tool {name!r}; available: {', '.join(sorted(names))}")
    if not isinstance(args, dict):
        return _error(id_, INVALID_PARAMS, "arguments must be a JSON object")
    if not backchannel.take(name, args):
        await backchannel.refused_ungranted(name)
        text = (
            f"error: not run: forgehand's policy did not allow this {name} call (an MCP call runs only as the "
            "agent's own tool call, after pre_tool_use)"
        )
        return _result(id_, {"content": [{"type": "text", "text": text}], "isError": True})
    try:
        text, is_error = await call(backchannel, name, args), False
    except ToolRefused as exc:
        text, is_error = str(exc), True
    return _result(id_, {"content": [{"type": "text", "text": text}], "isError": is_error})


async def _one(backchannel: Backchannel, message: Any) -> dict[str, Any] | None:
    """The response to one JSON-RPC message (None for a notification or a client's response)."""
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return _error(None, INVALID_REQUEST, "not a JSON-RPC 2.0 message")
    method = message.get("method")
    if "id" not in message:
        return None  # notifications/initialized, notifications/cancelled, a response: nothing to say
    id_ = message["id"]
    if not isinstance(method, str):
        return _error(id_, INVALID_REQUEST, "a request needs a method")
    params = message.get("params") or {}
    if not isinstance(params, dict):
        return _error(id_, INVALID_PARAMS, "params must be an object")
    if method == "initialize":
        return _result(id_, _initialize(params))
    if method == "ping":
        return _result(id_, {})
    if method == "tools/list":
        return _result(id_, _tools(backchannel))
    if method == "tools/call":
        return await _tool_call(backchannel, id_, params)
    return _error(id_, METHOD_NOT_FOUND, f"method {method!r} is not served")


async def serve_mcp(channel: object, headers: dict[str, str], body: bytes, send: Send) -> None:
    """One POST to /mcp, already authenticated as `channel`'s run by the gateway."""
    if not _local_origin(headers.get("origin", "")):
        await _answer(send, 403, _error(None, INVALID_REQUEST, "cross-origin requests are refused"))
        return
    version = headers.get("mcp-protocol-version", "")
    if version and version not in PROTOCOL_VERSIONS:
        await _answer(send, 400, _error(None, INVALID_REQUEST, f"unsupported MCP-Protocol-Version {version!r}"))
        return
    backchannel = attached(channel)
    if backchannel is None:
        await _answer(send, 503, _error(None, INVALID_REQUEST, "this run has no back-channel"))
        return
    try:
        message = json.loads(body)
    except ValueError:
        await _answer(send, 400, _error(None, PARSE_ERROR, "the body is not JSON"))
        return
    if isinstance(message, list):  # a batch (2025-03-26 clients)
        if not message:
            await _answer(send, 400, _error(None, INVALID_REQUEST, "an empty batch"))
            return
        answers = [a for a in [await _one(backchannel, m) for m in message] if a is not None]
        await _answer(send, 200, answers) if answers else await _answer(send, 202)
        return
    answer = await _one(backchannel, message)
    if answer is None:
        await _answer(send, 202)
    else:
        await _answer(send, 200, answer)
