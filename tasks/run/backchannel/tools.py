"""The back-channel's tools: one description and JSON schema each, offered the same to every agent
(MCP `tools/list`, the builtin runtime's function tools), and one dispatch (`call`). Arguments
the schema does not name (a task number, a repository) are ignored: the run is the token's."""

from typing import TYPE_CHECKING, Any

import msgspec
import structlog

from tasks.run.backchannel import review
from tasks.run.backchannel.service import GET_TOOL_RUN, OPTIONS_MAX, Backchannel, ToolRefused

if TYPE_CHECKING:
    from tasks.run.backchannel.custom import CustomTools

log = structlog.get_logger("forgehand.backchannel")

_S: dict[str, Any] = {"type": "string"}


class ToolSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str
    input_schema: dict[str, Any]


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": required}


TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="ask_user",
        description=(
            "Ask the person who started the task one clear question and stop: the task waits for their answer, "
            "which continues this session as the next message. Offer `options` when the answer is one of a few "
            "choices (shown as buttons; the person may still write their own)."
        ),
        input_schema=_schema(
            {"question": _S, "options": {"type": "array", "items": _S, "maxItems": OPTIONS_MAX}}, ["question"]
        ),
    ),
    ToolSpec(
        name="report_summary",
        description=(
            "Report what this run did, for the reviewers (once per run; the first report is kept). Call it when "
            "the goal is reached, before you stop."
        ),
        input_schema=_schema({"summary": _S}, ["summary"]),
    ),
    ToolSpec(
        name="record_progress",
        description="Record a short progress note on the task (shown live; rate-limited).",
        input_schema=_schema({"message": _S}, ["message"]),
    ),
    ToolSpec(
        name="spawn_subtask",
        description=(
            "Hand a separate piece of work to a subtask: a new task on this repository, run by the same agent on "
            "its own branch from this task's last commit (not this run's uncommitted changes), with its own token "
            "budget out of what this run has left. It runs on its own; its outcome appears on this task. Limited "
            "in depth and number per repository."
        ),
        input_schema=_schema(
            {"name": _S, "instructions": _S, "runtime": _S, "max_tokens": {"type": "integer", "minimum": 1}},
            ["name", "instructions"],
        ),
    ),
)
_LINE_COMMENT: dict[str, Any] = {
    "path": _S,
    "line": {"type": "integer", "minimum": 1},
    "side": {"type": "string", "enum": ["RIGHT", "LEFT"]},
    "body": _S,
}
# Offered to review tasks only (a task asked to review a pull request: its trigger's).
REVIEW_TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        name="submit_review",
        description=(
            "Submit your review of the pull request this task reviews, as your result (once per run: the first "
            "review is kept). verdict: comment or request_changes (approve only where the repository lets agents "
            f"approve); body: the review in markdown (at most {review.BODY_MAX} characters); comments: at most "
            f"{review.COMMENTS_MAX} line comments, each on a line the pull request's diff shows: path, line, side "
            "(RIGHT: the head's line number, the default; LEFT: the base's), body. A refused review posts nothing."
        ),
        input_schema=_schema(
            {
                "verdict": {"type": "string", "enum": ["comment", "request_changes", "approve"]},
                "body": _S,
                "comments": {
                    "type": "array",
                    "maxItems": review.COMMENTS_MAX,
                    "items": _schema(_LINE_COMMENT, ["path", "line", "body"]),
                },
            },
            ["verdict", "body"],
        ),
    ),
)
TOOL_NAMES = frozenset(t.name for t in (*TOOLS, *REVIEW_TOOLS)) | {"propose_tool", GET_TOOL_RUN}


PROPOSE_TOOL = ToolSpec(
    name="propose_tool",
    description=(
        "Propose a custom tool for this repository: a script with a parameter schema that agents could call as "
        "custom_<name> once a repository admin reviews and activates it. It is saved as a draft (each call to it "
        "will need a person's approval); you cannot call it yourself until then. parameters: a JSON schema object "
        "with flat properties of type string, number, integer or boolean (docs/tools.md)."
    ),
    input_schema=_schema(
        {
            "name": _S,
            "description": _S,
            "parameters": {"type": "object"},
            "script": _S,
            "interpreter": {"type": "string", "enum": ["sh", "bash", "python3", "node"]},
        },
        ["name", "description", "parameters", "script"],
    ),
)
GET_TOOL_RUN_SPEC = ToolSpec(
    name=GET_TOOL_RUN,
    description=(
        "The state and, once finished, the output of a custom tool's run this task made (a custom_* call that "
        "answered with a tool run id because it was still waiting for approval or running)."
    ),
    input_schema=_schema({"id": {"type": "integer", "minimum": 1}}, ["id"]),
)


def custom_specs(custom: "CustomTools") -> tuple[ToolSpec, ...]:
    """The repository's custom tools as `custom_<name>`, and `get_tool_run` to poll their runs."""
    if not custom.tools:
        return ()
    specs = []
    for t in custom.tools.values():
        note = " (each call waits for a person's approval)" if t.mode == "approval" else ""
        description = f"{t.description or 'A custom tool of this repository.'}{note}"
        schema = {k: v for k, v in t.parameters.items() if k != "description"}
        specs.append(ToolSpec(name=t.agent_name, description=description, input_schema=schema))
    return (*specs, GET_TOOL_RUN_SPEC)


def tools_for(channel: Backchannel | None) -> tuple[ToolSpec, ...]:
    """The tools a run's agent is offered: the review tool only to a review task, the repository's
    custom tools when it has any."""
    offered = TOOLS
    if channel is not None and channel.review_pull is not None:
        offered = (*offered, *REVIEW_TOOLS)
    if channel is not None and channel.may_propose:
        offered = (*offered, PROPOSE_TOOL)
    if channel is not None and channel.custom is not None:
        offered = (*offered, *custom_specs(channel.custom))
    return offered


async def call(channel: Backchannel, name: str, args: dict[str, Any]) -> str:
    """Run one tool; `ToolRefused` carries the error the agent reads (a fault of forgehand's too:
    the agent is told, the run goes on)."""
    try:
        return await _call(channel, name, args)
    except ToolRefused:
        raise
    except Exception as exc:
        log.exception("a back-channel tool failed", tool=name)
        raise ToolRefused(
            f"error: forgehand could not complete {name} ({type(exc).__name__}); try again later"
        ) from exc


async def _call(channel: Backchannel, name: str, args: dict[str, Any]) -> str:
    if name == "ask_user":
        return await channel.ask_user(args.get("question"), args.get("options"))
    if name == "report_summary":
        return await channel.report_summary(args.get("summary"))
    if name == "record_progress":
        # `note` was the builtin runtime's name for it before the back-channel.
        return await channel.record_progress(args.get("message", args.get("note")))
    if name == "spawn_subtask":
        return await channel.spawn_subtask(
            args.get("name"), args.get("instructions"), args.get("runtime"), args.get("max_tokens")
        )
    if name == "submit_review":
        return await channel.submit_review(args)
    if name == "propose_tool":
        return await channel.propose_tool(args)
    if channel.custom is not None and channel.custom.knows(name):
        return await channel.custom.call(name, args)
    offered = ", ".join(sorted(t.name for t in tools_for(channel)))
    raise ToolRefused(f"error: unknown tool {name!r}; available: {offered}")
