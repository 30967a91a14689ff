"""One run's back-channel: what its agent's `ask_user`, `report_summary`, `record_progress` and
`spawn_subtask` calls do, whichever way they arrive (the MCP server on the run's socket, or the
builtin runtime's function tools). The task and the run are this object's, fixed when the run
opened it; nothing an agent sends can name another.

- `ask_user` records the question (and its options) and tells the runtime, which ends the turn:
  the run settles `blocked`, a person answers on the task page, the answer resumes the session.
- `report_summary` is taken once per run; a second call is an error to the agent. After the run
  began to settle (`seal`) nothing is taken, so the summary the settle step stores is final.
- `record_progress` is a `progress` transcript event and a `task.progress` notification, at most
  `PROGRESS_BURST` at once and one per `PROGRESS_EVERY` seconds after that.
- `spawn_subtask` creates a subtask (`spawn.py`) within the repository's limits and
  the budget this run has left; a refusal creates nothing and is audited.
- `submit_review` (review tasks only) posts the task's bot's review of its pull request
  (`review.py`); the first review of a run is kept, a second call is an error to the agent."""

import collections
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Principal
from forge.core.errors import ForgeError
from forge.core.settings import Settings
from forge.db import audit
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import TaskProgress
from forge.db.models import Account, Repository
from forge.git import RepoStore
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Run, Task
from tasks.core.policy import input_hash
from tasks.core.transcript import Kind, Notice, Payload, Progress
from tasks.run.backchannel import review
from tasks.run.backchannel.proposals import propose
from tasks.run.backchannel.spawn import SpawnRequest, SubtaskRefused, spawn

if TYPE_CHECKING:  # custom.py runs tools through the run's engine, which imports this package
    from tasks.run.backchannel.custom import CustomTools

log = structlog.get_logger("forgehand.backchannel")

QUESTION_MAX = 4000
OPTION_MAX = 200
OPTIONS_MAX = 10
SUMMARY_MAX = 20_000
PROGRESS_MAX = 2000
PROGRESS_BURST = 5
PROGRESS_EVERY = 10.0  # seconds per note once the burst is spent
PROPOSALS_MAX = 5  # propose_tool calls taken per run


GET_TOOL_RUN = "get_tool_run"  # polls a custom tool's run (custom.py)


class ToolRefused(Exception):
    """The call is refused; the message is the tool's error result, for the agent."""


QuestionHook = Callable[[str, list[str]], Awaitable[None]]
Emit = Callable[[Kind, Payload], Awaitable[None]]


class Question(msgspec.Struct, frozen=True, kw_only=True):
    text: str
    options: list[str]


def _text(value: object, name: str, limit: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ToolRefused(f"error: {name} must be a non-empty string")
    if len(value) > limit or "\x00" in value:
        raise ToolRefused(f"error: {name} must be at most {limit} characters, without NUL")
    return value.strip()


def _options(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > OPTIONS_MAX:
        raise ToolRefused(f"error: options must be a list of at most {OPTIONS_MAX} strings")
    out: list[str] = []
    for item in value:
        text = _text(item, "each option", OPTION_MAX)
        if text not in out:
            out.append(text)
    return out


class Backchannel:
    def __init__(
        self,
        *,
        db: Database,
        lifecycle: Callable[[AsyncSession], Lifecycle],
        settings: Settings,
        task_id: int,
        run_id: int,
        emit: Emit,
        redact: Callable[[str], str] = lambda s: s,
        runtimes: frozenset[str] = frozenset(),
        remaining: Callable[[], int | None] = lambda: None,
        charge: Callable[[int], None] = lambda tokens: None,
        clock: Callable[[], float] = time.monotonic,
        store: RepoStore | None = None,
        review_pull: int | None = None,
    ) -> None:
        self.db = db
        self.lifecycle = lifecycle
        self.settings = settings
        self.task_id = task_id
        self.run_id = run_id
        self.emit = emit
        self.redact = redact
        self.runtimes = runtimes
        self.remaining = remaining  # what the run's budget has left (its subtasks' grants not taken off)
        self.charge = charge  # takes a grant off the run's own budget
        self.clock = clock
        self.store = store
        # A review task's pull request (its trigger's): `submit_review` is offered and posts there.
        self.review_pull = review_pull
        self.review: tuple[int, int] | None = None  # (pull request, review id) once submitted
        # The repository's custom tools (custom.py), once the run knows where they run.
        self.custom: CustomTools | None = None
        # The task's starter is an admin of the repository: its agent may propose a tool (a draft).
        self.may_propose = False
        self.proposed: list[str] = []
        self._reviewing = False
        self.question: Question | None = None
        self.summary: str | None = None
        self.sealed = False
        self.spawned: list[int] = []
        self.granted = 0  # tokens handed to this run's subtasks (out of what the run has left)
        self._on_question: QuestionHook | None = None
        # MCP calls the policy allowed, not yet made: (tool, input hash) -> how many. A CLI's MCP
        # call passes pre_tool_use first (its broker grants it here); anything else holding the run
        # token (a shell command curling the socket) finds no grant and runs nothing.
        self._grants: collections.Counter[tuple[str, str]] = collections.Counter()
        self.ungranted: collections.Counter[str] = collections.Counter()  # calls refused for want of a grant
        self._allowance = float(PROGRESS_BURST)
        self._refilled = clock()

    def grant(self, tool: str, args: object) -> None:
        """The policy allowed one MCP call of `tool` with exactly `args` (see `take`)."""
        self._grants[(tool, input_hash(args))] += 1

    def take(self, tool: str, args: object) -> bool:
        """Use up the grant for this exact call; False: no pre_tool_use allowed it."""
        key = (tool, input_hash(args))
        if self._grants[key] <= 0:
            return False
        self._grants[key] -= 1
        return True

    async def refused_ungranted(self, tool: str) -> None:
        """A call no policy decision allowed (something in the sandbox holding the run token, not the
        agent's own tool call) was refused: logged each time, the first of each tool noted in the
        transcript (the channel's rate and cap bound how many there can be)."""
        self.ungranted[tool] += 1
        log.warning("a back-channel call no policy decision allowed was refused", tool=tool,
                    task_id=self.task_id, run_id=self.run_id, count=self.ungranted[tool])  # fmt: skip
        if self.ungranted[tool] > 1:
            return
        text = (
            f"forgehand: a {tool} call on the back-channel that no policy decision allowed was refused "
            "(not the agent's own tool call); nothing was done"
        )
        try:
            await self.emit("notice", Notice(text=text, level="warning"))
        except Exception:
            log.warning("the refused back-channel call's transcript event was lost", exc_info=True)

    def set_question_hook(self, fn: QuestionHook | None) -> None:
        """The runtime's: called once with the question, so it ends the turn."""
        self._on_question = fn

    def seal(self) -> None:
        """The run settles: every later call is refused, what was taken stays."""
        self.sealed = True

    def _open(self) -> None:
        if self.sealed:
            raise ToolRefused("error: the run has ended; nothing was recorded")

    # --- the tools ----------------------------------------------------------------------------

    async def ask_user(self, question: object, options: object = None) -> str:
        self._open()
        text = _text(question, "question", QUESTION_MAX)
        offered = _options(options)
        if self.question is not None:
            raise ToolRefused("error: a question is already waiting for the user; stop here until they answer")
        self.question = Question(text=text, options=offered)
        if self._on_question is not None:
            await self._on_question(text, offered)
        return "The question was sent to the user. Stop here; their answer comes as the next message."

    async def report_summary(self, summary: object) -> str:
        self._open()
        text = _text(summary, "summary", SUMMARY_MAX)
        if self.summary is not None:
            raise ToolRefused("error: the summary of this run was already reported; it is kept as first reported")
        self.summary = text  # no await since the check: two calls cannot both get here
        return "summary recorded"

    def _take_allowance(self) -> bool:
        now = self.clock()
        self._allowance = min(float(PROGRESS_BURST), self._allowance + (now - self._refilled) / PROGRESS_EVERY)
        self._refilled = now
        if self._allowance < 1:
            return False
        self._allowance -= 1
        return True

    async def record_progress(self, message: object) -> str:
        self._open()
        text = self.redact(_text(message, "message", PROGRESS_MAX))
        if not self._take_allowance():
            raise ToolRefused(
                f"error: too many progress notes; at most {PROGRESS_BURST} at once, then one every "
                f"{PROGRESS_EVERY:g} s. This one was not recorded."
            )
        await self.emit("progress", Progress(text=text))
        async with self.db.session(write=True) as s:
            task = await s.get(Task, self.task_id)
            run = await s.get(Run, self.run_id)
            repo = await s.get(Repository, task.repo_id) if task is not None else None
            if task is not None and repo is not None:
                agent = await s.get(Account, task.agent_id)
                actor = Principal(account_id=task.agent_id, login=agent.login if agent else "", type="Bot")
                await self.lifecycle(s).publish("task.progress", task, repo, actor=actor, run=run,
                                                data=TaskProgress(message=text))  # fmt: skip
        return "noted"

    async def spawn_subtask(
        self, name: object, instructions: object, runtime: object = None, max_tokens: object = None
    ) -> str:
        self._open()
        if runtime is not None and not isinstance(runtime, str):
            raise ToolRefused("error: runtime must be a string")
        if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
            raise ToolRefused("error: max_tokens must be an integer")
        request = SpawnRequest(
            name=name if isinstance(name, str) else "",
            instructions=instructions if isinstance(instructions, str) else "",
            runtime=runtime or "",
            max_tokens=max_tokens,
        )
        left = self.remaining()
        left = None if left is None else left - self.granted
        try:
            async with self.db.session(write=True) as s:
                made = await spawn(
                    self.lifecycle(s),
                    self.settings,
                    parent_id=self.task_id,
                    run_id=self.run_id,
                    request=request,
                    runtimes=self.runtimes,
                    remaining=left,
                )
        except SubtaskRefused as exc:
            await self._audit_refusal(request, str(exc))
            raise ToolRefused(str(exc)) from None
        self.spawned.append(made.number)
        if left is not None and made.token_budget is not None:
            self.granted += made.token_budget
            self.charge(made.token_budget)  # the parent may spend that much less itself
        budget = f"{made.token_budget} tokens per run" if made.token_budget is not None else "the repository's budget"
        return (
            f"subtask #{made.number} created ({made.title}): runtime {made.runtime}, branch {made.branch} from this "
            f"task's last commit, {budget}. It runs on its own; its outcome shows on this task. {made.url}"
        )

    async def submit_review(self, args: dict[str, Any]) -> str:
        """A review task's review, posted as its bot (review.py); the first one of a run is kept."""
        self._open()
        if self.review_pull is None or self.store is None:
            raise ToolRefused("error: submit_review is for review tasks only (a task asked to review a pull request)")
        if self.review is not None or self._reviewing:
            raise ToolRefused("error: this run already submitted its review; it is kept as first submitted")
        try:
            data = review.parse(args)
            self._reviewing = True  # set before the first await: a parallel call is refused above
            self.review = await review.post(self.db, self.lifecycle, self.store, self.task_id, data, self.redact)
        except review.ReviewRefused as exc:
            raise ToolRefused(str(exc)) from None
        finally:
            self._reviewing = False
        number, review_id = self.review
        return (
            f"review {review_id} posted on pull request #{number} ({data.verdict}, {len(data.comments)} line comments)"
        )

    async def propose_tool(self, args: dict[str, Any]) -> str:
        """A draft of a repository tool (or a new draft version of one), always `approval` mode and
        never active: a repository admin reviews it (docs/tools.md, "Proposals")."""
        self._open()
        if not self.may_propose:
            raise ToolRefused("error: only a task started by an admin of the repository may propose tools")
        if len(self.proposed) >= PROPOSALS_MAX:
            raise ToolRefused(f"error: at most {PROPOSALS_MAX} proposals per run")
        try:
            name, version = await propose(self.db, self.task_id, args)
        except (ForgeError, ValueError) as exc:
            raise ToolRefused(f"error: {getattr(exc, 'detail', exc)}; nothing was saved") from None
        self.proposed.append(name)
        return (
            f"proposed: version {version} of the tool {name} is saved as a draft (approval mode, not active); "
            "a repository admin reviews it. You cannot call it until they activate it."
        )

    async def _audit_refusal(self, request: SpawnRequest, why: str) -> None:
        try:
            async with self.db.session(write=True) as s:
                task = await s.get(Task, self.task_id)
                assert task is not None
                agent = await s.get(Account, task.agent_id)
                repo = await s.get(Repository, task.repo_id)
                login = agent.login if agent else ""
                principal = Principal(account_id=task.agent_id, login=login, type="Bot", via="internal")
                target = f"{repo.owner.login}/{repo.name}#{task.number}" if repo else f"#{task.number}"
                audit.record_refused(s, Actor(principal=principal), "task.subtask.spawn", target,
                                     name=request.name[:200], runtime=request.runtime, reason=why[:500])  # fmt: skip
        except Exception:
            log.warning("the refused spawn's audit row was lost", exc_info=True)
