"""One call of one policy endpoint within a dispatch: wait for a concurrency slot, sign, send,
decode the answer strictly, retry a connection error once (after 250 ms, same body, new `jti`),
and log every attempt. What the endpoint did is an `EndpointResult`; how the answers of every
endpoint combine is `webhooks.policy.dispatcher`."""

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

import msgspec

from webhooks.core.config import WebhooksConfig
from webhooks.core.outbound import Outbound, OutboundError, Reply
from webhooks.core.signing import SigningKey, redacted, request_headers, sign_jwt
from webhooks.policy.answers import Decision, PolicyAnswer, ProtocolViolation, decode_policy_response
from webhooks.policy.log_writer import LogRow
from webhooks.sdk.protocol import MAX_POLICY_RESPONSE

ResultClass = Literal[
    "ok", "denied", "asked", "http_error", "protocol_error", "timeout", "connection_error", "over_capacity"
]
FAILURES: frozenset[str] = frozenset({"http_error", "protocol_error", "timeout", "connection_error", "over_capacity"})
RETRY_BACKOFF = 0.25
LOG_RESPONSE_BYTES = 64 * 1024


class EndpointResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one endpoint did in one dispatch."""

    endpoint_id: int
    url: str
    result: ResultClass
    decision: Decision | None  # what the consumer answered (None: no opinion, or it failed)
    effective: Decision | None  # what it counts as (a failure per failure_policy; None: no opinion)
    failure_policy: str
    reason: str
    status: int | None
    attempts: int
    latency_ms: float
    detail: str  # short, safe to show (never the raw response)
    delivery_id: str

    @property
    def failed(self) -> bool:
        return self.result in FAILURES


class Target(msgspec.Struct, frozen=True):
    """A policy endpoint as the dispatcher calls it (cached per repository)."""

    id: int
    url: str
    failure_policy: str
    key: SigningKey


@dataclass
class _Sent:
    """One attempt: when it started, what was sent, and the reply or why there is none."""

    started_at: datetime
    a0: float  # time.monotonic() at its start
    headers: list[tuple[str, str]]
    jti: str
    outcome: Reply | OutboundError


@dataclass
class _Call:
    """One endpoint's call within one dispatch, across its attempts."""

    target: Target
    event_type: str
    wid: str
    subject: str
    body: bytes
    budget: float
    end: float  # time.monotonic() of the dispatch's deadline
    log_rows: list[LogRow]
    t0: float = field(default_factory=time.monotonic)
    attempts: int = 0

    def finish(
        self,
        result: ResultClass,
        *,
        answer: PolicyAnswer | None = None,
        status: int | None = None,
        detail: str = "",
    ) -> tuple[EndpointResult, PolicyAnswer | None]:
        """What the endpoint did, and its answer (None when it failed)."""
        decision = answer.decision if answer is not None else None
        if result in FAILURES:
            effective: Decision | None = {"closed": "deny", "hold": "ask"}.get(self.target.failure_policy)  # type: ignore[assignment]
            reason = f"hook dispatch failed: {self.event_type}: {result} (delivery {self.wid})"
        else:
            effective = decision
            reason = answer.reason if answer is not None else ""
        return (
            EndpointResult(
                endpoint_id=self.target.id,
                url=self.target.url,
                result=result,
                decision=decision,
                effective=effective,
                failure_policy=self.target.failure_policy,
                reason=reason,
                status=status,
                attempts=self.attempts,
                latency_ms=round((time.monotonic() - self.t0) * 1000, 3),
                detail=detail[:300],
                delivery_id=self.wid,
            ),
            answer if result not in FAILURES else None,
        )

    def log(self, sent: _Sent, reply: Reply | None, result: str, error: str) -> None:
        """The delivery-log row of the attempt just made."""
        self.log_rows.append(
            {
                "endpoint_id": self.target.id,
                "wid": self.wid,
                "jti": sent.jti,
                "kind": "policy",
                "event_type": self.event_type,
                "attempt": self.attempts,
                "url": self.target.url,
                "request_headers": redacted(sent.headers),
                "request_body": self.body,
                "response_status": reply.status if reply is not None else None,
                "response_headers": [list(h) for h in reply.headers] if reply is not None else [],
                "response_body": reply.body[:LOG_RESPONSE_BYTES] if reply is not None else b"",
                "response_truncated": bool(
                    reply is not None and (reply.truncated or len(reply.body) > LOG_RESPONSE_BYTES)
                ),
                "duration_ms": int((time.monotonic() - sent.a0) * 1000),
                "result": result,
                "error": error[:500],
                "started_at": sent.started_at,
            }
        )


def _judge(event_type: str, reply: Reply) -> tuple[ResultClass, PolicyAnswer | None, str]:
    """A reply's result class, the answer it holds (strictly decoded) and what went wrong."""
    if not 200 <= reply.status < 300:
        return (
            "http_error",
            None,
            f"HTTP {reply.status}" + (" (redirects are not followed)" if 300 <= reply.status < 400 else ""),
        )
    try:
        answer = decode_policy_response(event_type, reply.body, truncated=reply.truncated)
    except ProtocolViolation as exc:
        return "protocol_error", None, str(exc)
    result: ResultClass = {"deny": "denied", "ask": "asked"}.get(answer.decision or "", "ok")  # type: ignore[assignment]
    return result, answer, ""


class EndpointCaller:
    """Calls one endpoint at a time for the dispatcher, at most `policy_concurrency` at once."""

    def __init__(self, cfg: WebhooksConfig, outbound: Outbound) -> None:
        self.cfg = cfg
        self.outbound = outbound
        self._slots = asyncio.Semaphore(max(1, cfg.policy_concurrency))

    async def call(
        self,
        target: Target,
        event_type: str,
        wid: str,
        subject: str,
        body: bytes,
        budget: float,
        end: float,
        log_rows: list[LogRow],
    ) -> tuple[EndpointResult, PolicyAnswer | None]:
        call = _Call(target, event_type, wid, subject, body, budget, end, log_rows)
        while True:
            refused = await self._take_slot(call)
            if refused is not None:
                return refused
            sent = await self._attempt(call)
            if isinstance(sent.outcome, Reply):
                result, answer, detail = _judge(event_type, sent.outcome)
                call.log(sent, sent.outcome, result, detail)
                return call.finish(result, answer=answer, status=sent.outcome.status, detail=detail)
            failure: ResultClass = "timeout" if sent.outcome.kind == "timeout" else "connection_error"
            call.log(sent, None, failure, sent.outcome.detail)
            retry = sent.outcome.kind == "connection_error" and call.attempts == 1
            if retry and end - time.monotonic() > RETRY_BACKOFF:
                await asyncio.sleep(RETRY_BACKOFF)
                continue
            return call.finish(failure, detail=sent.outcome.detail)

    async def _take_slot(self, call: _Call) -> tuple[EndpointResult, PolicyAnswer | None] | None:
        """Wait for a concurrency slot within the deadline; the endpoint's result when there is none."""
        remaining = call.end - time.monotonic()
        if remaining <= 0:
            return call.finish("timeout", detail="the dispatch deadline passed before this endpoint was called")
        try:
            async with asyncio.timeout(remaining):
                await self._slots.acquire()
        except TimeoutError:
            return call.finish("over_capacity", detail="no free slot before the deadline")
        return None

    async def _attempt(self, call: _Call) -> _Sent:
        """One attempt in the slot just taken (released after): sign (a new `jti`), send."""
        call.attempts += 1
        started_at = self.cfg.clock()
        a0 = time.monotonic()
        try:
            now = int(time.time())
            token, jti = sign_jwt(
                call.target.key,
                issuer=self.cfg.instance_id,
                subject=call.subject,
                audience=call.target.url,
                wid=call.wid,
                event_type=call.event_type,
                body=call.body,
                budget=call.budget,
                now=now,
            )
            headers = request_headers(
                token=token,
                event_type=call.event_type,
                wid=call.wid,
                notification_keys=None,
                timestamp=now,
                body=call.body,
            )
            outcome: Reply | OutboundError = await self.outbound.post(
                call.target.url,
                headers,
                call.body,
                total_timeout=call.end - time.monotonic(),
                max_response=MAX_POLICY_RESPONSE,
            )
        except OutboundError as exc:
            outcome = exc
        finally:
            self._slots.release()
        return _Sent(started_at, a0, headers, jti, outcome)
