"""JSON-RPC 2.0 over an agent's stdio, one JSON object per line (the ACP stdio transport).

forgehand's own small client rather than PyPI `agent-client-protocol` (0.12.1): that library
needs asyncio StreamReader/StreamWriter pairs or its own Transport (the sandbox gives a line
process), brings pydantic as a second validation stack beside msgspec, and validates incoming
requests into its models before the client sees them, so a `session/request_permission` with an
unknown option kind is answered by the library with an invalid-params error and never reaches
forgehand's policy (no `pre_tool_use`, nothing in the transcript). The protocol surface forgehand
needs is five methods and two notifications; decoding stays lenient here and every decision
(what an odd message means) is taken by the runtime, where it is tested.

`Peer` sends requests and notifications, routes the agent's responses to the waiting request by
id (a response nobody waits for, a second one included, is counted and dropped), and hands the
agent's requests and notifications to the runtime's handler. The pipe is read in the background
(cli_lines.StdoutReader) and the lines that piled up since the last batch are handled together,
up to `BATCH_LINES`; `settle` is called after each batch and before a response is handed to its
request: a handler may hold back what a batch's notifications stood for and store it in one go
(the acp runtime's transcript events), and everything is out before the request goes on.
Notifications, the bulk of a busy stream, go to `notified` (synchronous) when there is one.
When the agent's stdout ends, every waiting request fails with `AgentExited`."""

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import msgspec

from sandbox import truncated
from tasks.core.capping import HeadTail
from tasks.core.states import FailureReason
from tasks.run.runtimes.cli_lines import LineBatches, StdoutReader, json_object

LINE_CAP = 8 * 1024 * 1024  # a longer line is not JSON-RPC we read


class LineProcess(LineBatches, Protocol):
    """What `Sandbox.spawn` gives (and the tests' host process)."""

    async def write(self, data: bytes) -> None: ...


class RpcError(Exception):
    """The agent answered a request with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.data = data


class AgentExited(Exception):
    """The agent's stdout ended while a request waited for its response."""


class Incoming(msgspec.Struct, kw_only=True):
    """A request (with `id`) or a notification (without) from the agent."""

    method: str
    params: Any = None
    id: int | str | None = None
    is_request: bool = False


Handler = Callable[[Incoming], Awaitable[None]]
Settle = Callable[[], Awaitable[None]]
# A notification (method, params), taken synchronously: the stream's bulk, thousands a second.
Notified = Callable[[str, Any], None]

# JSON-RPC error codes forgehand answers with.
METHOD_NOT_FOUND = -32601
INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


class Peer:
    def __init__(
        self,
        proc: LineProcess,
        handler: Handler,
        raw: HeadTail | None = None,
        *,
        settle: Settle | None = None,
        notified: Notified | None = None,
    ) -> None:
        self.proc = proc
        self.handler = handler  # requests (and notifications when there is no `notified`)
        self.raw = raw
        self.settle = settle
        self.notified = notified
        self._next = 0
        self._waiting: dict[int, asyncio.Future[Any]] = {}
        self._writes = asyncio.Lock()
        self.closed = False  # stdout ended
        self.open = True  # stdin still writable
        self.stray_responses = 0  # responses to no waiting request (unknown or answered twice)
        self.malformed = 0

    async def _send(self, obj: dict[str, Any]) -> bool:
        if not self.open:
            return False
        line = msgspec.json.encode(obj) + b"\n"
        async with self._writes:
            try:
                await self.proc.write(line)
            except Exception:
                self.open = False
                return False
        if self.raw is not None:
            self.raw.add(b"> " + line)
        return True

    async def request(self, method: str, params: Any, *, limit: float | None = None) -> Any:
        self._next += 1
        request_id = self._next
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            if self.closed or not await self._send(
                {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}
            ):
                raise AgentExited(f"the agent is gone (before {method})")
            async with asyncio.timeout(limit):
                return await asyncio.shield(future)
        finally:
            self._waiting.pop(request_id, None)

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    async def respond(self, request_id: int | str | None, result: Any) -> None:
        await self._send({"jsonrpc": "2.0", "id": request_id, "result": result})

    async def respond_error(self, request_id: int | str | None, code: int, message: str) -> None:
        await self._send({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}})

    async def close_stdin(self) -> None:
        if self.open:
            self.open = False
            closer = getattr(self.proc, "close_stdin", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()

    async def read(self, on_line: Callable[[], None] | None = None) -> None:
        """Read the agent's stdout until it ends (run as a task). The pipe is read in the
        background (`StdoutReader`) while a batch is handled: its store does not hold the agent up,
        and what piled up meanwhile (up to `BATCH_LINES` lines) is the next batch."""
        reader = StdoutReader(self.proc)
        try:
            # No deadline here: silence is the run's watchdog's business.
            while (batch := await reader.next_lines(None)) is not None:
                if on_line is not None:
                    on_line()
                if self.raw is not None:  # one copy a batch for the raw stream artefact
                    self.raw.add(b"< " + b"\n< ".join(batch) + b"\n")
                for line in batch:
                    if len(line) > LINE_CAP or truncated(line):
                        self.malformed += 1
                        continue
                    await self._dispatch(line)
                if self.settle is not None:
                    await self.settle()
        finally:
            self.closed = True
            for future in self._waiting.values():
                if not future.done():
                    future.set_exception(AgentExited("the agent's output ended"))
                    future.exception()  # retrieved here; the request re-raises it
            await reader.close()

    async def _dispatch(self, raw: bytes) -> None:
        message = json_object(raw)
        if message is None:
            self.malformed += 1  # agents log to stdout by mistake at times: not fatal
            return
        method = message.get("method")
        if isinstance(method, str):
            has_id = "id" in message and isinstance(message["id"], (int, str))
            if not has_id and self.notified is not None:  # asks for no answer: taken in passing
                self.notified(method, message.get("params"))
                return
            incoming = Incoming(method=method, params=message.get("params"), id=message.get("id"), is_request=has_id)
            await self.handler(incoming)
            return
        if "result" in message or "error" in message:
            future = self._waiting.get(message["id"]) if isinstance(message.get("id"), int) else None
            if future is None or future.done():
                self.stray_responses += 1
                return
            if self.settle is not None:  # what the batch held back goes before the request goes on
                await self.settle()
            error = message.get("error")
            if isinstance(error, dict):
                code = error.get("code")
                future.set_exception(
                    RpcError(code if isinstance(code, int) else INTERNAL_ERROR, str(error.get("message") or ""),
                             error.get("data"))
                )  # fmt: skip
                future.exception()
            else:
                future.set_result(message.get("result"))
            return
        self.malformed += 1


_UNREACHABLE = ("connection", "econnrefused", "etimedout", "enotfound", "timed out", "socket")


def failure_of(error: RpcError) -> FailureReason:
    """The typed reason of a run whose prompt the agent answered with an error."""
    lowered = str(error).lower()
    if "maximum number of turns" in lowered:  # the Claude adapter at its maxTurns
        return FailureReason.TURN_LIMIT
    if "api error" in lowered or "model" in lowered:
        return FailureReason.MODEL_UNREACHABLE if any(w in lowered for w in _UNREACHABLE) else FailureReason.MODEL_ERROR
    return FailureReason.AGENT_NO_RESULT
