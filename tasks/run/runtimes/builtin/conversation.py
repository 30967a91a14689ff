"""The builtin runtime's conversation across runs: the system prompt of a first run, and the stored
conversation resumed with what the next run was asked (an answer becomes the `ask_user` call's
tool result; calls a run ended before are answered as not run)."""

from typing import Any

from tasks.core.states import RunKind
from tasks.run.runtimes.base import RunContext

SYSTEM_PROMPT = """You are a coding agent working in a git work tree at /workspace (your current directory).
Use the tools to inspect and change files and to run commands; there is no network.
When the goal is reached, call report_summary with a short summary of what you changed, then stop calling tools.
If you cannot continue without a person's decision, call ask_user with one clear question (and options when it is
a choice). record_progress notes progress; spawn_subtask hands a separate piece of work to a subtask."""


def resume(ctx: RunContext) -> list[dict[str, Any]]:
    """The conversation this run goes on with: a first run's system prompt and goal, or the stored
    conversation with what the run was asked (an answer, a message, a retry) and the calls left
    pending answered."""
    messages = list(ctx.conversation)
    if not messages:
        return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ctx.prompt}]
    pending = pending_tool_calls(messages)
    if ctx.kind == RunKind.APPROVAL and ctx.approval is not None:
        return messages  # the parked call is answered with the decision first (runtime.py)
    if ctx.kind == RunKind.ANSWER and pending:
        for call in pending:
            is_question = call.get("function", {}).get("name") == "ask_user"
            content = ctx.prompt if is_question else "not run: the run ended before this call"
            messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": content})
        return messages
    for call in pending:
        messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": "not run: the run ended"})
    if ctx.kind == RunKind.RETRY:
        messages.append({"role": "user", "content": "The previous attempt ended early. Continue with the goal."})
    else:
        messages.append({"role": "user", "content": ctx.prompt})
    return messages


def pending_tool_calls(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls of the last assistant message that have no result yet."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.get("role") == "assistant":
            answered = {m.get("tool_call_id") for m in messages[i + 1 :] if m.get("role") == "tool"}
            return [c for c in msg.get("tool_calls") or [] if isinstance(c, dict) and c.get("id") not in answered]
    return []
