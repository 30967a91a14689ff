"""A task's custom tool calls that wait for a person (docs/tools.md, "Approval"): the cards the
task page shows for them (`tasks/_tool_run_card.html`, one per run in `awaiting_approval`, read
from the runs themselves, never from transcript events) and the decision their Approve / Deny
buttons post: the same `tool_runs.decide` as `POST .../tool-runs/{id}/approve`, in a write
transaction of its own, for whoever may decide the task's calls (`rules.require_decide`)."""

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.errors import InvalidInput, InvalidState, NotFound
from forge.db.engine import utcnow
from forge.repos.repositories import RepoResource
from tasks.core.custom_tool_schemas import ToolRunRead
from tasks.core.models import Task
from tasks.http.actions import precheck_then_write
from tasks.http.deps import TaskScope
from tasks.http.pages.common import visible_json
from tasks.http.pages.forms import DecisionForm
from tasks.services import tool_runs
from tasks.services.tasks import TaskService

REASON_MAX = 2000  # as `POST .../tool-runs/{id}/deny` takes it
CARDS_MAX = 20


@dataclass
class ToolRunCard:
    """A call that waits: the run, its validated inputs as a person reads them, whether its time
    to be approved is over (the sweeper has not marked it yet: no buttons then)."""

    read: ToolRunRead
    inputs: str
    expired: bool

    @property
    def reason_input(self) -> str:
        return reason_input(self.read.id)


def reason_input(run_id: int) -> str:
    return f"tool-run-{run_id}-reason"


async def waiting_cards(session: AsyncSession, task: Task) -> list[ToolRunCard]:
    """The task's tool runs in `awaiting_approval`, oldest first."""
    runs = await tool_runs.awaiting(session, task.id, limit=CARDS_MAX)
    if not runs:
        return []
    now = utcnow()
    return [
        # Autoescaped as text: the person sees the exact inputs, invisible characters shown escaped.
        ToolRunCard(read=r, inputs=visible_json(r.inputs), expired=r.expires_at is not None and r.expires_at <= now)
        for r in await tool_runs.reads(session, runs)
    ]


def _approves(form: DecisionForm) -> bool:
    if form.decision not in ("approve", "deny"):
        raise InvalidInput("decision: approve or deny")
    return form.decision == "approve"


async def decide(scope: TaskScope, run_id: int, form: DecisionForm) -> None:
    """Approve or deny one waiting call of this task. The card's inputs hash binds the decision
    to the inputs the person saw; a second decision, or one after the expiry, is refused (409)."""
    approve = _approves(form)
    reason = form.reason.replace("\r\n", "\n").strip()
    if len(reason) > REASON_MAX:
        raise InvalidInput(f"reason: at most {REASON_MAX} characters (got {len(reason)})", field="reason")

    async def precheck(svc: TaskService, res: RepoResource, task: Task) -> None:
        return None  # a tool run's decision has no prompt to check

    async def write(svc: TaskService, res: RepoResource, task: Task, _: None) -> None:
        run = await tool_runs.get(svc.session, scope.actor.principal, res, run_id)
        if run.task_id != task.id:
            raise NotFound(f"no tool run {run_id} on task #{task.number}", code="not_found")
        if form.input_hash and form.input_hash != run.inputs_hash:
            raise InvalidState(
                f"tool run {run_id}'s inputs are not those the page showed you: reload and decide again",
                code="invalid_state",
            )
        await tool_runs.decide(svc.life, scope.actor, res, run, approve=approve, reason=reason)

    await precheck_then_write(scope, precheck, write)
