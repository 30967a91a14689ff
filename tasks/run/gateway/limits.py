"""How many hook and back-channel calls a run's sandbox may make on its channel: a rate (a token
bucket: `rate` calls a second sustained, `burst` at once) and a cap on the run's total. Each of
those calls makes the host work (a policy webhook dispatched, transcript events written): without
a limit, one sandbox posting forged `/hooks/*` calls as fast as it can slows every run and the API.

A real agent makes at most a few tool calls a second, each two hook calls (before and after), a
handful at once when it calls tools in parallel; the defaults (`FORGEHAND_RUN_CHANNEL_CALL_*`,
docs/operator.md) are far above that. Past a limit the channel answers 429 (a refused hook denies
its tool call) after a short pause, so that a refusal costs the host less than the attempt."""

import time
from collections.abc import Callable
from typing import Literal

import msgspec

Refusal = Literal["", "rate", "cap"]
# A refused call is answered after this pause: a flood over one connection stays a trickle.
REFUSAL_PAUSE_SECONDS = 0.1


class CallLimits(msgspec.Struct, frozen=True, kw_only=True):
    rate: float = 10.0  # calls a second, sustained
    burst: int = 100  # calls at once, above the rate
    cap: int = 20_000  # calls in the whole run


class CallLimiter:
    def __init__(self, limits: CallLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.calls = 0  # let through
        self.refused: dict[str, int] = {"rate": 0, "cap": 0}
        self._clock = clock
        self._tokens = float(limits.burst)
        self._at = clock()

    def take(self) -> Refusal:
        """Let one call through (""), or say which limit refuses it."""
        now = self._clock()
        self._tokens = min(float(self.limits.burst), self._tokens + (now - self._at) * self.limits.rate)
        self._at = now
        refusal: Refusal = ""
        if self.calls >= self.limits.cap:
            refusal = "cap"
        elif self._tokens < 1:
            refusal = "rate"
        if refusal:
            self.refused[refusal] += 1
            return refusal
        self._tokens -= 1
        self.calls += 1
        return ""

    def retry_after(self) -> int:
        """Whole seconds until the rate lets a call through again."""
        return max(1, int((1 - self._tokens) / self.limits.rate + 0.999))

    def describe(self, refusal: Refusal) -> str:
        if refusal == "cap":
            return f"the run made its {self.limits.cap} hook and back-channel calls: every further one is refused"
        limits = self.limits
        return (
            f"the run's hook and back-channel calls passed {limits.rate:g} a second (bursts of {limits.burst}): "
            "calls over the rate are refused"
        )
