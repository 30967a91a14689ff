"""One upstream connection of the gateway's HTTP/1.1 client (tasks/run/gateway/upstream.py): the
asyncio `Protocol` that feeds the socket's bytes straight into httptools (`Connection`), the
parser's callbacks for one answer (`AnswerParser`: its head capped, its body pieces held), and the
read timer re-armed lazily from the last byte."""

import asyncio
from collections import deque
from collections.abc import Awaitable
from typing import TypeVar

import httptools
import httpx

T = TypeVar("T")
HELD = 256 * 1024  # bytes of an answer held for the agent's side before reading pauses


class Connection(asyncio.Protocol):
    """One upstream connection. The socket's bytes go straight into the current answer's parser
    (no StreamReader, no coroutine and timeout context per read: per streamed event that was
    a good part of the gateway's own work), a waiting reader is woken by a bare future, and the
    read timeout is one timer per timeout window, pushed back lazily from the time of the last
    byte instead of set and cancelled around every read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.answer: AnswerParser | None = None
        self.closed = False
        self.error: Exception | None = None
        self.paused = False  # reading paused: the agent's side has not taken what came
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None  # set while writing is paused
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0  # when the last byte came (loop time)
        self._wait_from = 0.0
        self._limit = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._last = self.loop.time()
        answer = self.answer
        if answer is None or answer.complete:  # bytes nobody asked for: not reusable
            self.close()
            return
        try:
            answer.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ if isinstance(exc.__context__, AnswerHeadTooLarge) else exc
            self.error = httpx.RemoteProtocolError(str(cause))
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"the answer is not valid HTTP/1.1: {exc}")
        if answer.extra:  # what came after the answer is dropped, and the connection with it
            answer.keep_alive = False
        if answer.held > HELD and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(httpx.WriteError(str(exc or "the connection was closed")))
        self._wake()

    def pause_writing(self) -> None:
        self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)
        self._writable = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def taken(self) -> None:
        """The agent's side took what was held: read on."""
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    async def write(self, message: bytes, seconds: float | None) -> None:
        if self.closed or self.transport is None:
            raise httpx.RemoteProtocolError("the connection was closed before the request was sent")
        self.transport.write(message)
        if self._writable is not None:  # more than the buffer's high-water mark waits to go
            await within(seconds, self._writable, httpx.WriteTimeout, "the write timed out")

    async def wait(self, seconds: float | None) -> None:
        """Until bytes come or the connection ends; httpx.ReadTimeout after `seconds` without a byte."""
        if self.closed or self.error is not None:
            return
        waiter = self._waiter = self.loop.create_future()
        if seconds is not None:
            self._wait_from, self._limit = self.loop.time(), seconds
            due = self._wait_from + seconds
            if self._timer is not None and self._timer.when() > due:
                self._timer.cancel()
                self._timer = None
            if self._timer is None:
                self._timer = self.loop.call_at(due, self._check)
        try:
            await waiter
        finally:
            self._waiter = None

    def _check(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        due = max(self._last, self._wait_from) + self._limit
        if self.loop.time() >= due:
            waiter.set_exception(httpx.ReadTimeout(f"no byte of the answer for {self._limit} s"))
        else:
            self._timer = self.loop.call_at(due, self._check)

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.transport is not None:
            self.transport.close()


# An answer's head (status line aside): far above any provider's, far below what would let an
# upstream make the worker hold memory without bound (the body has its own caps).
MAX_HEAD_BYTES = 64 * 1024


class AnswerHeadTooLarge(Exception):
    pass


class AnswerParser:
    """httptools' callbacks: the status, headers and body pieces of one answer."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.head_bytes = 0
        self.extra = False  # bytes came after the answer ended (a server that pipelines answers)
        self.until_close = False
        self.complete = False
        self.keep_alive = False  # read when the answer ends (the parser forgets it after)
        self.body: deque[bytes] = deque()
        self.held = 0  # bytes in `body`
        self.parser = httptools.HttpResponseParser(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.complete:  # a second message after this one: never part of this answer
            self.extra = True
            return
        self.head_bytes += len(name) + len(value) + 4
        if self.head_bytes > MAX_HEAD_BYTES:
            raise AnswerHeadTooLarge(f"the answer's head is over {MAX_HEAD_BYTES // 1024} KiB")
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.complete:
            return
        self.head_done = True
        names = {name.lower() for name, _ in self.headers}
        # Neither a length nor chunks: the body ends when the server closes the connection.
        self.until_close = b"content-length" not in names and b"transfer-encoding" not in names

    def on_body(self, body: bytes) -> None:
        if self.complete:
            self.extra = True
            return
        self.body.append(body)
        self.held += len(body)

    def on_message_complete(self) -> None:
        if self.complete:
            self.extra = True
            return
        self.complete = True
        self.keep_alive = self.parser.should_keep_alive()


async def within(seconds: float | None, what: Awaitable[T], error: type[httpx.TimeoutException], text: str) -> T:
    try:
        async with asyncio.timeout(seconds):
            return await what
    except TimeoutError:
        raise error(text) from None
