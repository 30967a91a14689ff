"""A run's token budget as the gateway enforces it: the tokens of settled calls plus what the
calls still in flight may spend. A call is refused once nothing is left; a stream is cut when
the run's total reaches the limit; either way `exhausted` is set and the execution ends the run
`token_budget` (tasks/run/execution.py).

Calls in parallel: each call in flight holds a reservation for the most it may spend, its
request's input (about four bytes a token: what it will be charged for reading it, which OpenAI
reports only at the end of the answer) plus the output it declares as its maximum (`max_tokens`,
`max_completion_tokens` times `n`, `max_output_tokens`; a call that declares none may spend all
that is left). A non-streaming answer cannot be cut on its way back, so only the reservation
bounds it. A new call is admitted alone whenever the budget is not used up (a lone call is
never refused for its own size: its stream is cut if it runs over, a whole answer is charged
before it is returned); next to calls in flight, only while the settled tokens, their
reservations and its own fit in the limit. Otherwise it is turned away for now (429 with
Retry-After: the budget is not exhausted, the calls in flight may leave some of it). So however
many calls an agent opens at once, the run spends at most its limit plus one call's maximum."""

import asyncio

# The gateway's own answers (budget used up or reserved, upstream unreachable, refused or timed
# out) carry this header (`budget`, `budget-reserved`, `unreachable`, `refused`, `timeout`), so a
# runtime can tell them from the provider's.
GATEWAY_HEADER = "x-forgehand-gateway"
BYTES_PER_TOKEN = 4


class _Held:
    """What one call in flight holds: its reservation, its request's input in tokens, and (when
    it streams) the running estimate of what it spent."""

    __slots__ = ("estimate", "input", "reserved")

    def __init__(self, reserved: int, input_tokens: int) -> None:
        self.reserved = reserved
        self.input = input_tokens
        self.estimate = 0


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no budget
        self.used = 0
        self.granted = 0  # handed to the run's subtasks (spawn_subtask): no longer the run's to spend
        self.exhausted = asyncio.Event()
        self._calls: dict[int, _Held] = {}

    @property
    def text(self) -> str:
        return f"token budget of {self.limit} exceeded"

    def left(self) -> bool:
        return not self.limit or self.used + self.granted < self.limit

    def grant(self, tokens: int) -> None:
        """Tokens the run handed to a subtask: its own calls may spend that much less."""
        self.granted += tokens
        if self.limit and self.used + self.granted >= self.limit:
            self.exhausted.set()

    def _in_flight(self, skip: int = 0) -> int:
        return sum(max(h.reserved, h.estimate) for call, h in self._calls.items() if call != skip)

    def admit(self, call: int, request_bytes: int, max_output: int | None) -> bool:
        """Hold a reservation for a call about to go upstream: its input (`request_bytes` in
        tokens) plus `max_output`, the output it declares as its maximum (None: it declares
        none, and may spend all that is left). False: it does not fit beside the calls in flight
        (nothing is held then)."""
        input_tokens = request_bytes // BYTES_PER_TOKEN
        if max_output is None:
            max_output = max(self.limit - self.used - self.granted, 0) if self.limit else 0
        reserve = input_tokens + max_output
        if self.limit and self._calls and self.used + self.granted + self._in_flight() + reserve > self.limit:
            return False
        self._calls[call] = _Held(reserve, input_tokens)
        return True

    def stream_over(self, call: int, estimate: int) -> bool:
        """Record a streaming call's estimate; True when the run would pass its budget (this
        call counted by its estimate, the others by their reservations)."""
        held = self._calls.get(call)
        if held is not None:
            held.estimate = estimate
        if not self.limit:
            return False
        return self.used + self.granted + estimate + self._in_flight(skip=call) >= self.limit

    def settle(self, call: int, tokens: int, *, input_known: bool = True) -> None:
        """Charge a call that reached the provider, in place of its reservation. When its answer
        never said what the input cost (OpenAI reports usage only at the end: an agent that hangs
        up after the first delta, a chat stream without usage), the request's size in tokens
        (what the provider bills for reading it) is charged on top of what streamed."""
        held = self._calls.pop(call, None)
        if not input_known and held is not None:
            tokens += held.input
        self.used += tokens
        if self.limit and self.used + self.granted >= self.limit:
            self.exhausted.set()

    def release(self, call: int) -> None:
        """Drop a call's reservation without charging it (it never reached the provider)."""
        self._calls.pop(call, None)

    def cut(self) -> None:
        self.exhausted.set()
