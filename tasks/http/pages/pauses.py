"""Tool calls that wait for a person (a policy's `ask`, a question to the user) as the task page
shows them: paused, then decided or answered, never as a failure of the call."""

from dataclasses import dataclass, field

from tasks.core.schemas import ApprovalRead

# The tools an agent asks the person a question with: forgehand's back-channel `ask_user` (the
# builtin loop's own, or `mcp__forgehand__ask_user` through a CLI's MCP client) and Claude Code's
# AskUserQuestion.
QUESTION_TOOLS = ("ask_user", "AskUserQuestion")
# What an agent is told when forgehand ends its turn for a person (a parked call, a question):
# Claude Code's own words for an interrupted call, and forgehand's refusals of the calls after it.
# A pause, not an error.
HELD_MARKERS = (
    "doesn't want to proceed with this tool use",
    "not run yet: this",
    "not run: the run is ending",
    "The question was sent to the user",
)


def is_question_tool(name: str) -> bool:
    return name in QUESTION_TOOLS or name.endswith("__ask_user")


def held(output: str) -> bool:
    """The result of a call forgehand held for a person, not a failure of the call."""
    return any(m in output for m in HELD_MARKERS)


@dataclass
class Pause:
    """A tool call that waits for a person: an approval (a policy's `ask`) or a question."""

    kind: str  # "approval" | "question"
    status: str  # "waiting for your approval", "approved by ana", "question for you", "answered by ana", ...
    waiting: bool  # still waiting (the task is blocked on it)
    ran: bool = False  # approved: the call ran (its result is a result)
    reason: str = ""  # why a policy asked, or the reason the person gave with their decision
    question: str = ""
    options: list[str] = field(default_factory=list)
    answer_seq: int = 0  # the answer's prompt event


def approval_pause(a: ApprovalRead | None, *, blocked: bool) -> Pause:
    """A parked call's pause, as its approval stands (None: the approval is not known here)."""
    if a is None:
        return Pause("approval", "waiting for your approval" if blocked else "parked for approval", blocked)
    who = f" by {a.decided_by}" if a.decided_by else ""
    status = {
        "pending": "waiting for your approval",
        "approved": f"approved{who}",
        "denied": f"denied{who}",
        "expired": "expired: nobody decided in time",
        "cancelled": "cancelled: the task was stopped",
    }.get(a.state, a.state)
    # Waiting: why the policy asked; decided: the person's reason, if they gave one.
    reason = a.reason if a.state == "pending" else a.decision_reason
    return Pause("approval", status, a.state == "pending", ran=a.state == "approved", reason=reason)
