"""The live transcript over Server-Sent Events (docs/transcript.md), with Litestar's
`ServerSentEvent`: replay from the database after `Last-Event-ID` (or `?after=`), then follow;
`event: state` (no id) while the task is active, a `: heartbeat` comment after 15 s of silence,
and `event: end` once the task rests and everything was sent.

The events of one database read go out as one chunk (`Frames`): one ASGI message, so one gzip
flush and one socket write per read, not per event (per event, those were most of the server's
work with ten followers), and each payload is sent as the JSON text the database holds."""

import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec
from litestar import Controller, Request, get
from litestar.params import QueryParameter
from litestar.response import ServerSentEvent, ServerSentEventMessage
from sqlalchemy.exc import TimeoutError as PoolTimeout

from tasks.core import transcript
from tasks.core.models import Task
from tasks.core.states import TaskState
from tasks.http.deps import DEPENDENCIES, TASK, TaskScopeDep
from tasks.system import TaskSystem

HEARTBEAT_SECONDS = 15.0
RETRY_MS = 2000
PAGE = 1000

_json = msgspec.json.Encoder()


class Frames(ServerSentEventMessage):
    """Several transcript events as one chunk of the stream, each its own SSE frame (`id`,
    `event`, `data`), as `ServerSentEventMessage.encode` writes one. Litestar sends whatever a
    message encodes to as one body chunk; this is the one way to hand it several at once."""

    def __init__(self, events: list[transcript.EventRaw]) -> None:
        super().__init__(data=None)
        self.events = events

    def encode(self) -> bytes:
        out = bytearray()
        for ev in self.events:
            data = _json.encode(ev)
            if b"\n" in data or b"\r" in data:  # not from our serializer: framed line by line
                out += ServerSentEventMessage(id=ev.seq, event=ev.kind, data=data).encode()
            else:
                out += b"id: %d\r\nevent: %s\r\ndata: %s\r\n\r\n" % (ev.seq, ev.kind.encode(), data)
        return bytes(out)


async def sse_stream(
    system: TaskSystem,
    task_id: int,
    after: int,
    *,
    heartbeat: float = HEARTBEAT_SECONDS,
    poll: float | None = None,
) -> AsyncIterator[ServerSentEventMessage]:
    """Replay from the database after `after`, then follow (woken by the hub, polling every
    `poll` seconds besides: the hub's interval by default); end once the task rests and all is sent."""
    db = system.db
    poll = poll if poll is not None else system.hub.poll_seconds
    last = after
    last_write = time.monotonic()
    seen_state = ""
    # A frame of its own (not `ServerSentEvent(retry_duration=...)`, which glues the field onto
    # the first event): the client learns the delay before anything else arrives.
    yield ServerSentEventMessage(data=None, retry=RETRY_MS)
    with system.hub.waiter(task_id) as waiter:
        while True:
            # A follower holds a pooled connection only for this read, never while it waits.
            try:
                async with db.session() as s:
                    # State first: a resting state is committed after every event of the run that ended.
                    task_state = await s.get(Task, task_id, populate_existing=True)
                    resting = task_state is None or TaskState(task_state.state).is_resting
                    events = await transcript.read_raw(s, task_id, after=last, limit=PAGE)
            except PoolTimeout:
                # The pool stayed full (a burst): a stream already under way cannot answer 503;
                # it reads again shortly, from where it was (nothing is skipped).
                await waiter.wait(poll)
                continue
            if task_state is not None and task_state.state != seen_state and not resting:
                # No id: a state is not a transcript event (resuming replays events, not states).
                seen_state = task_state.state
                yield ServerSentEventMessage(event="state", data=_json.encode({"state": seen_state}).decode())
            if events:
                yield Frames(events)
            if events:
                last = events[-1].seq
                last_write = time.monotonic()
                if len(events) == PAGE:
                    continue
            if resting:
                state_name = task_state.state if task_state is not None else "gone"
                end = {"state": state_name, "last_seq": last}
                yield ServerSentEventMessage(event="end", data=_json.encode(end).decode())
                return
            remaining = heartbeat - (time.monotonic() - last_write)
            if remaining <= 0:
                yield ServerSentEventMessage(data=None, comment="heartbeat")
                last_write = time.monotonic()
                continue
            await waiter.wait(min(poll, remaining))


def resume_point(request: Request[Any, Any, Any], after: int | None) -> int:
    start = after or 0
    last_event_id = request.headers.get("last-event-id", "").strip()
    if last_event_id.isdigit() and len(last_event_id) < 10:
        start = max(start, int(last_event_id))
    return start


class TaskEventsController(Controller):
    tags = ["tasks"]
    dependencies = DEPENDENCIES

    @get(TASK + "/events", summary="The live transcript (Server-Sent Events; resumes from Last-Event-ID)")
    async def events(
        self,
        request: Request[Any, Any, Any],
        task_scope: TaskScopeDep,
        after: Annotated[int | None, QueryParameter(name="after", ge=0, le=2**31 - 1)] = None,
    ) -> ServerSentEvent:
        return ServerSentEvent(
            sse_stream(task_scope.system, task_scope.task.id, resume_point(request, after)),
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
