"""A run's token budget as the gateway enforces it: the tokens of settled calls plus the running
estimate of the calls still streaming. A call is refused once nothing is left; a stream is cut
when its estimate reaches the limit; either way `exhausted` is set and the execution ends the
run `token_budget` (tasks/run/execution.py)."""

import asyncio

# The gateway's own answers (budget used up, upstream unreachable or timed out) carry this header
# (`budget`, `unreachable`, `timeout`), so a runtime can tell them from the provider's.
GATEWAY_HEADER = "x-forgehand-gateway"


class Budget:
    def __init__(self, limit: int) -> None:
        self.limit = limit  # 0: no budget
        self.used = 0
        self.exhausted = asyncio.Event()
        self._live: dict[int, int] = {}

    @property
    def text(self) -> str:
        return f"token budget of {self.limit} exceeded"

    def left(self) -> bool:
        return not self.limit or self.used < self.limit

    def stream_over(self, call: int, estimate: int) -> bool:
        """Record a streaming call's estimate; True when the run would pass its budget."""
        self._live[call] = estimate
        if not self.limit:
            return False
        return self.used + sum(self._live.values()) >= self.limit

    def settle(self, call: int, tokens: int) -> None:
        self._live.pop(call, None)
        self.used += tokens
        if self.limit and self.used >= self.limit:
            self.exhausted.set()

    def cut(self) -> None:
        self.exhausted.set()
