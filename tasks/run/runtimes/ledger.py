"""Verify, do not trust: every tool call that ran is matched against the policy decision forgehand
made for it.

The hooks and permission prompts are forgehand's way in; the agent's own output (Claude Code's
stream-json, `codex exec --json`, ACP `session/update`, the builtin loop's calls) is what actually
happened. A runtime tells the ledger each decision it took (`decided`: allow or deny, by tool-use
id, with the input that was put to the policy and the policy's rewrite of it) and each call the
stream shows a result for (`ran`). A call that ran without an allow decision for it is a bypass: a
hook that answered without asking forgehand, a tool the hooks do not see, an input other than the
one decided. The first bypass trips the run (`tripped`): the supervisor ends it as failed
`policy_bypass` and the work stays on the task branch as a work-in-progress commit.

Matching is by tool-use id where the CLI gives the same id to both sides (Claude Code, the ACP
adapters, the builtin loop); the codex runtime, whose stream items carry ids of their own, matches
an item to the call its hook allowed by content first (codex/stream.py) and hands the ledger the
call's id, or no id when nothing matched. A call decided `deny` whose refusal comes back as an
error result is no bypass; one the CLI refused itself before any decision (an unknown tool, an
input that failed its schema, a turn cut short) is filtered by the runtime before it asks.

Ordering: a result can only follow the call's execution, which follows the decision (the
decision is recorded before its answer goes out), so a result with no decision is never a race.
The stream's announcement of a call (`announce`) may come before or after the hook, which is why
hooks wait for it (`announced`) for a bounded time where a runtime requires it."""

import asyncio
import hashlib
import json
from typing import Any

import msgspec

ANNOUNCE_WAIT = 10.0  # seconds a hook call waits for the stream to announce its tool-use id
_KEEP = 4096  # ids remembered per kind (a run with more calls forgets the oldest)


class Bypass(msgspec.Struct, frozen=True, kw_only=True):
    tool_use_id: str
    tool_name: str
    tool_input: Any = None
    reason: str


class _Decision(msgspec.Struct, kw_only=True):
    allowed: bool
    inputs: set[str]


def input_key(tool_input: Any) -> str:
    """A tool input's identity (canonical JSON; key order is moot)."""
    return hashlib.sha256(json.dumps(tool_input, sort_keys=True, default=str).encode()).hexdigest()


INPUT_CAP = 16 * 1024  # characters of a bypassing call's input kept in its record


def _capped(tool_input: Any) -> Any:
    """The input as recorded: itself, or the head of its JSON when it is long (a whole file's
    content in a Write)."""
    text = json.dumps(tool_input, ensure_ascii=False, default=str)
    return tool_input if len(text) <= INPUT_CAP else text[:INPUT_CAP] + " ...(cut)"


NOT_GIVEN: Any = msgspec.UNSET  # `ran` without the input the stream showed (not compared)


class DecisionLedger:
    """One run's decisions and the calls its agent ran."""

    def __init__(self) -> None:
        self._decisions: dict[str, _Decision] = {}
        self._announced: dict[str, asyncio.Event] = {}
        self.checked: set[str] = set()  # ids whose result was verified (once each)
        self.bypasses: list[Bypass] = []
        self.tripped = asyncio.Event()

    # --- what forgehand decided ---------------------------------------------------------------

    def decided(self, tool_use_id: str, tool_input: Any, *, allowed: bool, runs: Any = NOT_GIVEN) -> None:
        """A decision for a call: the input put to the policy, and `runs` the input that runs
        when the policy rewrote it. A later allow of the same id (an approved call) adds to it."""
        if not tool_use_id:
            return
        keys = {input_key(tool_input)} | ({input_key(runs)} if runs is not NOT_GIVEN and runs is not None else set())
        known = self._decisions.get(tool_use_id)
        if known is None:
            if len(self._decisions) >= _KEEP:
                self._decisions.pop(next(iter(self._decisions)))
            self._decisions[tool_use_id] = _Decision(allowed=allowed, inputs=keys)
            return
        known.allowed = known.allowed or allowed
        known.inputs |= keys

    def is_decided(self, tool_use_id: str) -> bool:
        return tool_use_id in self._decisions

    # --- what the stream announced ------------------------------------------------------------

    def announce(self, tool_use_id: str) -> None:
        """The agent's stream showed this call (before or after its hook)."""
        if not tool_use_id:
            return
        seen = self._announced.get(tool_use_id)
        if seen is None:
            if len(self._announced) >= _KEEP:
                self._announced.pop(next(iter(self._announced)))
            seen = self._announced[tool_use_id] = asyncio.Event()
        seen.set()

    def was_announced(self, tool_use_id: str) -> bool:
        seen = self._announced.get(tool_use_id)
        return seen is not None and seen.is_set()

    async def announced(self, tool_use_id: str, wait: float = ANNOUNCE_WAIT) -> bool:
        """Whether the stream announces this id within `wait` seconds (a hook call for an id the
        agent never showed is forged: no policy is asked for it)."""
        if not tool_use_id:
            return False
        seen = self._announced.get(tool_use_id)
        if seen is None:
            seen = self._announced[tool_use_id] = asyncio.Event()
        try:
            async with asyncio.timeout(wait):
                await seen.wait()
        except TimeoutError:
            if not seen.is_set():
                self._announced.pop(tool_use_id, None)
            return False
        return True

    # --- what ran -----------------------------------------------------------------------------

    def ran(
        self,
        tool_use_id: str,
        tool_name: str,
        tool_input: Any = NOT_GIVEN,
        *,
        error: bool = False,
        shown: Any = NOT_GIVEN,
    ) -> Bypass | None:
        """A result of a call arrived: the bypass it shows (recorded, the run tripped), or None.
        `error`: the result is an error (a refusal comes back as one). `shown`: the input the
        stream showed, for the record only, where it is not compared (an ACP adapter's own shape)."""
        if tool_use_id and tool_use_id in self.checked:
            return None
        if tool_use_id:
            self.checked.add(tool_use_id)
        why = self._why(tool_use_id, tool_input, error)
        if not why:
            return None
        recorded = tool_input if tool_input is not NOT_GIVEN else shown
        kept = None if recorded is NOT_GIVEN else _capped(recorded)
        bypass = Bypass(tool_use_id=tool_use_id, tool_name=tool_name, tool_input=kept, reason=why)
        self.bypasses.append(bypass)
        self.tripped.set()
        return bypass

    def _why(self, tool_use_id: str, tool_input: Any, error: bool) -> str:
        decision = self._decisions.get(tool_use_id) if tool_use_id else None
        if decision is None:
            return "it ran without a policy decision (no pre_tool_use was asked for it)"
        if not decision.allowed:
            return "" if error else "it ran although the policy denied it"
        if tool_input is not NOT_GIVEN and input_key(tool_input) not in decision.inputs:
            return "it ran with an input other than the one the policy allowed"
        return ""

    @property
    def first(self) -> Bypass | None:
        return self.bypasses[0] if self.bypasses else None
