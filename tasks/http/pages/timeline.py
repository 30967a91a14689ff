"""The transcript as a timeline for people: typed items built from the stored events
(`timeline_items.py`), put together here. Tool calls become cards with their input shown as the
agent wrote it (a command as the command, written content as content, an edit as a small diff),
their result and the policy decisions about them; a call that waits for a person shows what it
waits for (`pauses.py`); stdout/stderr runs and the system phases of a run fold into one item;
output is shown up to a page's budget.

Pure and synchronous (markdown rendering is CPU work): call `build` in a worker thread."""

from collections.abc import Iterable

from tasks.core.schemas import ApprovalRead
from tasks.core.transcript import EventRead
from tasks.http.pages.pauses import Pause, approval_pause, is_question_tool
from tasks.http.pages.timeline_items import Item, item_of

# The stdout/stderr text one render of the timeline shows at most, in all (a run may store up to
# 16 MiB of it: tasks/core/capping.py STREAM_STORE_CAP).
PAGE_OUTPUT_BYTES = 2 * 1024 * 1024


class OutputBudget:
    """How much stdout/stderr text one render shows (UTF-8 bytes, as the page carries it): the
    rest is said, not shown (the whole transcript is `GET .../transcript`)."""

    def __init__(self, limit: int = PAGE_OUTPUT_BYTES) -> None:
        self.left = limit
        self.told = False

    def cut(self, item: Item) -> None:
        kept: list[tuple[int, str]] = []
        for seq, text in item.chunks:
            size = len(text.encode("utf-8", "replace"))
            if size <= self.left:
                self.left -= size
                kept.append((seq, text))
                continue
            shown = text.encode("utf-8", "replace")[: max(self.left, 0)].decode("utf-8", "ignore")
            self.left = 0
            if not self.told:
                self.told = True
                shown += f"\n[... more output than a page shows ({PAGE_OUTPUT_BYTES} bytes): see the API ...]\n"
            kept.append((seq, shown))
        item.chunks = kept


class _Timeline:
    """Items in the making (see `build`)."""

    def __init__(self, approvals: Iterable[ApprovalRead], active: bool, ahead: set[str]) -> None:
        self.items: list[Item] = []
        self.calls: dict[str, Item] = {}
        self.ahead = ahead  # the calls among these events (a decision recorded first waits for its call)
        self.early: dict[str, list[Item]] = {}
        self.budget = OutputBudget()
        self.approvals: dict[tuple[int | None, str], ApprovalRead] = {(a.run, a.tool_use_id): a for a in approvals}
        self.active = active
        self.asked: list[Pause] = []  # questions no prompt followed yet

    def add(self, e: EventRead) -> None:
        item = item_of(e)
        if item.kind == "output":
            self.budget.cut(item)
        if item.kind == "result" and self._into_call(item, e.seq):
            return
        if item.kind == "policy" and self._policy_of_call(item, e.seq):
            return
        if item.kind == "question" and item.pause is not None:
            self.asked.append(item.pause)
            call = self._asking_call(item)
            if call is not None:
                call.pause, call.last_seq = item.pause, e.seq
                if call.result is not None:
                    call.result.held = True
                return
        if item.kind == "prompt":
            self._answer(item)
        if self._merged(item, e.seq):
            return
        item.last_seq = e.seq
        if item.kind == "tool" and item.tool_id:
            self.calls[item.tool_id] = item
            parked = self.approvals.get((item.run, item.tool_id))
            if parked is not None:
                item.pause = approval_pause(parked, blocked=self.active)
            for decided in self.early.pop(item.tool_id, []):
                self._decided(item, decided)
        self.items.append(item)

    def _policy_of_call(self, item: Item, seq: int) -> bool:
        """A tool hook's decision goes into its call's card: `pre_tool_use` before the call,
        `post_tool_use` after its outcome. Records without the call's id (older ones) go to the
        run's last call still waiting for its result (pre), or its last call with one (post)."""
        if item.event not in ("pre_tool_use", "post_tool_use"):
            return False
        item.last_seq = seq
        if item.tool_id:
            call = self.calls.get(item.tool_id)
            if call is None and item.tool_id in self.ahead:
                self.early.setdefault(item.tool_id, []).append(item)
                return True
        else:
            call = self._last_call(item.run, with_result=item.event == "post_tool_use")
        if call is None:
            return False
        self._decided(call, item)
        call.last_seq = max(call.last_seq, seq)
        return True

    def _decided(self, call: Item, decision: Item) -> None:
        (call.before if decision.event == "pre_tool_use" else call.after).append(decision)
        if decision.event == "pre_tool_use" and decision.decision == "ask" and call.pause is None:
            call.pause = approval_pause(None, blocked=self.active)

    def _last_call(self, run: int | None, *, with_result: bool) -> Item | None:
        for item in reversed(self.items):
            if item.run != run:
                return None
            if item.kind == "tool":
                return item if (item.result is not None) == with_result else None
        return None

    def _into_call(self, item: Item, seq: int) -> bool:
        call = self.calls.get(item.tool_id)
        if call is None or call.result is not None or item.result is None:
            return False
        call.result, call.last_seq = item.result, seq
        if call.pause is not None and not call.pause.ran:
            item.result.held = True  # a denied, expired or still parked call: what the agent was told
        return True

    def _asking_call(self, question: Item) -> Item | None:
        """The tool call that asked this question: the one it names, else the run's last call of a
        question tool (a CLI agent's question does not name its call)."""
        named = self.calls.get(question.tool_id) if question.tool_id else None
        if named is not None and named.pause is None:
            return named
        for item in reversed(self.items):
            if item.run != question.run:
                break
            if item.kind == "tool" and is_question_tool(item.name) and item.pause is None:
                return item
        return None

    def _answer(self, prompt: Item) -> None:
        """A prompt after a question: the answer (source `answer`), or the question went unanswered."""
        if not self.asked:
            return
        *earlier, last = self.asked
        for p in earlier:
            p.status, p.waiting = "not answered", False
        answered = prompt.label.startswith("answer")
        who = prompt.label.removeprefix("answer").strip()
        last.status = ("answered " + who).strip() if answered else "not answered"
        last.waiting = False
        last.answer_seq = prompt.seq if answered else 0
        self.asked = []

    def _merged(self, item: Item, seq: int) -> bool:
        last = self.items[-1] if self.items else None
        if (
            last is not None
            and last.run == item.run
            and item.kind in ("output", "phases")
            and last.kind == item.kind
            and last.label == item.label
        ):
            last.chunks += item.chunks
            last.phases += item.phases
            last.last_seq = seq
            return True
        return False

    def finish(self) -> list[Item]:
        """A question nothing followed waits while the task is active (it is blocked on it, or is
        about to be); on a task that came to rest otherwise it was never answered."""
        for p in self.asked[:-1]:
            p.status, p.waiting = "not answered", False
        if self.asked and not self.active:
            self.asked[-1].status, self.asked[-1].waiting = "not answered", False
        return self.items


def build(events: list[EventRead], approvals: Iterable[ApprovalRead] = (), *, active: bool = False) -> list[Item]:
    """Items in order: a tool's result and the policy decisions about it go into its call's card
    (when the call is among these events), consecutive output chunks of one stream and
    consecutive phases of one run merge.
    A call parked for a person (`approvals`, the task's) or asking a question shows what it waits
    for, or how it was decided, never as an error. `active`: the task is queued, running or
    blocked (an open question waits for an answer). Output text is shown up to `PAGE_OUTPUT_BYTES`."""
    ahead = {str(e.payload.get("id") or "") for e in events if e.kind == "tool_call"}
    timeline = _Timeline(approvals, active, ahead)
    for e in events:
        timeline.add(e)
    return timeline.finish()
