"""The builtin runtime's side of the model: the tool schema it offers and one chat completion
against an OpenAI-compatible endpoint (retrying 429/5xx with Retry-After, and connection errors).
In a run that endpoint is the run's model gateway (tasks/run/gateway), which holds the real key:
its own answers say why in `x-forgehand-gateway` (`unreachable`, `timeout`, `budget`)."""

import asyncio
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from forge.db.engine import utcnow
from tasks.core.states import FailureReason
from tasks.run.backchannel import PROPOSE_TOOL, REVIEW_TOOLS, Backchannel, custom_specs
from tasks.run.backchannel import TOOLS as BACKCHANNEL
from tasks.run.gateway.budget import GATEWAY_HEADER
from tasks.run.runtimes.base import ModelEndpoint

MAX_ATTEMPTS = 5
MAX_RETRY_AFTER = 60.0


def tool_fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_S = {"type": "string"}
TOOLS: list[dict[str, Any]] = [
    tool_fn(
        "bash",
        "Run a shell command in the sandbox (bash -lc); returns exit code and output.",
        {"command": _S},
        ["command"],
    ),
    tool_fn("read_file", "Read a text file of the work tree.", {"path": _S}, ["path"]),
    tool_fn(
        "write_file", "Create or replace a file of the work tree.", {"path": _S, "content": _S}, ["path", "content"]
    ),
    tool_fn(
        "edit_file",
        "Replace one exact occurrence of old_string with new_string in a file.",
        {"path": _S, "old_string": _S, "new_string": _S},
        ["path", "old_string", "new_string"],
    ),
    tool_fn("list_files", "List a directory of the work tree.", {"path": _S}, []),
    # The back-channel's tools, with the schemas its MCP server lists.
    *(tool_fn(t.name, t.description, t.input_schema["properties"], t.input_schema["required"]) for t in BACKCHANNEL),
]
# A review task's tool, offered to review tasks only (`chat(..., tools=REVIEW_TASK_TOOLS)`).
REVIEW_TASK_TOOLS: list[dict[str, Any]] = [
    *TOOLS,
    *(tool_fn(t.name, t.description, t.input_schema["properties"], t.input_schema["required"]) for t in REVIEW_TOOLS),
]
TOOL_NAMES = {t["function"]["name"] for t in REVIEW_TASK_TOOLS}


def tools_of(channel: Backchannel | None) -> list[dict[str, Any]]:
    """The function tools of a run: a review task's tool to review tasks, and the repository's
    custom tools (`custom_<name>`, their parameter schema as written) when it has any."""
    offered = REVIEW_TASK_TOOLS if channel is not None and channel.review_pull is not None else TOOLS
    extra = [*([PROPOSE_TOOL] if channel is not None and channel.may_propose else [])]
    if channel is not None and channel.custom is not None:
        extra += custom_specs(channel.custom)
    return [
        *offered,
        *(
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.input_schema},
            }
            for t in extra
        ),
    ]


class ModelFailure(Exception):
    def __init__(self, reason: FailureReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _gateway_message(resp: httpx.Response) -> str:
    try:
        error = resp.json().get("error") or {}
        return str(error.get("message") or "")[:500] if isinstance(error, dict) else ""
    except (ValueError, AttributeError):
        return ""


def retry_after(resp: httpx.Response, attempt: int) -> float:
    base = min(2.0**attempt * 0.5, MAX_RETRY_AFTER)
    raw = resp.headers.get("retry-after", "").strip()
    if raw:
        try:
            return min(max(float(raw), 0.0), MAX_RETRY_AFTER)
        except ValueError:
            try:
                return min(max((parsedate_to_datetime(raw) - utcnow()).total_seconds(), 0.0), MAX_RETRY_AFTER)
            except (TypeError, ValueError):
                pass
    return base


async def chat(
    client: httpx.AsyncClient, model: ModelEndpoint, messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS
) -> dict[str, Any]:
    """One chat completion, retrying 429/5xx (honouring Retry-After) and connection errors."""
    url = model.base_url.rstrip("/") + "/chat/completions"
    headers = {"Authorization": f"Bearer {model.api_key}"} if model.api_key else {}
    body = {"model": model.model, "messages": messages, "tools": tools}
    last_error = ""
    for attempt in range(MAX_ATTEMPTS):
        try:
            # Through the gateway, its own timeout (the same setting) answers first, with a 504.
            timeout = model.timeout + 5 if model.uds else model.timeout
            resp = await client.post(url, json=body, headers=headers, timeout=timeout)
        except httpx.TimeoutException:
            last_error = f"the model endpoint did not answer within {model.timeout:g} s"
            await asyncio.sleep(min(2.0**attempt * 0.5, 10))
            continue
        except httpx.TransportError as exc:
            last_error = f"the model endpoint is unreachable ({type(exc).__name__})"
            await asyncio.sleep(min(2.0**attempt * 0.5, 10))
            continue
        said = resp.headers.get(GATEWAY_HEADER, "")
        if said == "budget":
            raise ModelFailure(FailureReason.TOKEN_BUDGET, _gateway_message(resp) or "token budget exceeded")
        if said in ("unreachable", "timeout"):
            # The gateway could not reach the endpoint (or it did not answer in time): the same
            # words as when this client called it directly.
            last_error = _gateway_message(resp) or f"the model endpoint is unreachable ({said})"
            await asyncio.sleep(min(2.0**attempt * 0.5, 10))
            continue
        if resp.status_code == 429 or resp.status_code >= 500:
            last_error = f"the model endpoint answered {resp.status_code}"
            await asyncio.sleep(retry_after(resp, attempt))
            continue
        if resp.status_code != 200:
            raise ModelFailure(FailureReason.MODEL_ERROR, f"the model endpoint answered {resp.status_code}")
        try:
            data = resp.json()
            message = data["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelFailure(FailureReason.MODEL_ERROR, "the model endpoint sent a malformed answer") from None
        if not isinstance(message, dict):
            raise ModelFailure(FailureReason.MODEL_ERROR, "the model endpoint sent a malformed answer")
        return {"message": message, "usage": data.get("usage") or {}}
    reason = (
        FailureReason.MODEL_UNREACHABLE
        if "unreachable" in last_error or "within" in last_error
        else FailureReason.MODEL_ERROR
    )
    raise ModelFailure(reason, f"{last_error} (after {MAX_ATTEMPTS} attempts)")
