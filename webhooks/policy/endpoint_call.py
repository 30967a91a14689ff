"""One call of one policy endpoint within a dispatch: wait for a concurrency slot, sign, send,
decode the answer strictly, retry a connection error once (after 250 ms, same body, new `jti`),
and log every attempt. What the endpoint did is an `EndpointResult`; how the answers of every
endpoint combine is `webhooks.policy.dispatcher`."""

import asyncio
import time
from datetime import datetime
from typing import Any, Literal

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
        t0 = time.monotonic()
        attempts = 0

        def finish(
            result: ResultClass,
            *,
            answer: PolicyAnswer | None = None,
            status: int | None = None,
            detail: str = "",
        ) -> tuple[EndpointResult, PolicyAnswer | None]:
            decision = answer.decision if answer is not None else None
            if result in FAILURES:
                effective: Decision | None = {"closed": "deny", "hold": "ask"}.get(target.failure_policy)  # type: ignore[assignment]
                reason = f"hook dispatch failed: {event_type}: {result} (delivery {wid})"
            else:
                effective = decision
                reason = answer.reason if answer is not None else ""
            return (
                EndpointResult(
                    endpoint_id=target.id,
                    url=target.url,
                    result=result,
                    decision=decision,
                    effective=effective,
                    failure_policy=target.failure_policy,
                    reason=reason,
                    status=status,
                    attempts=attempts,
                    latency_ms=round((time.monotonic() - t0) * 1000, 3),
                    detail=detail[:300],
                    delivery_id=wid,
                ),
                answer if result not in FAILURES else None,
            )

        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return finish("timeout", detail="the dispatch deadline passed before this endpoint was called")
            try:
                async with asyncio.timeout(remaining):
                    await self._slots.acquire()
            except TimeoutError:
                return finish("over_capacity", detail="no free slot before the deadline")
            attempts += 1
            started_at = self.cfg.clock()
            a0 = time.monotonic()
            try:
                now = int(time.time())
                token, jti = sign_jwt(
                    target.key,
                    issuer=self.cfg.instance_id,
                    subject=subject,
                    audience=target.url,
                    wid=wid,
                    event_type=event_type,
                    body=body,
                    budget=budget,
                    now=now,
                )
                headers = request_headers(
                    token=token, event_type=event_type, wid=wid, notification_keys=None, timestamp=now, body=body
                )
                outcome: Any = await self.outbound.post(
                    target.url,
                    headers,
                    body,
                    total_timeout=end - time.monotonic(),
                    max_response=MAX_POLICY_RESPONSE,
                )
            except OutboundError as exc:
                outcome = exc
            finally:
                self._slots.release()
            if isinstance(outcome, OutboundError):
                failure: ResultClass = "timeout" if outcome.kind == "timeout" else "connection_error"
                log_rows.append(
                    _log_row(
                        target,
                        wid,
                        jti,
                        event_type,
                        attempts,
                        headers,
                        body,
                        None,
                        failure,
                        outcome.detail,
                        a0,
                        started_at,
                    )
                )
                retry = outcome.kind == "connection_error" and attempts == 1
                if retry and end - time.monotonic() > RETRY_BACKOFF:
                    await asyncio.sleep(RETRY_BACKOFF)
                    continue
                return finish(failure, detail=outcome.detail)
            reply: Reply = outcome
            result: ResultClass
            answer: PolicyAnswer | None = None
            detail = ""
            if not 200 <= reply.status < 300:
                result = "http_error"
                detail = f"HTTP {reply.status}" + (" (redirects are not followed)" if 300 <= reply.status < 400 else "")
            else:
                try:
                    answer = decode_policy_response(event_type, reply.body, truncated=reply.truncated)
                except ProtocolViolation as exc:
                    result, detail = "protocol_error", str(exc)
                else:
                    result = {"deny": "denied", "ask": "asked"}.get(answer.decision or "", "ok")  # type: ignore[assignment]
            log_rows.append(
                _log_row(target, wid, jti, event_type, attempts, headers, body, reply, result, detail, a0, started_at)
            )
            return finish(result, answer=answer, status=reply.status, detail=detail)


def _log_row(
    target: Target,
    wid: str,
    jti: str,
    event_type: str,
    attempt: int,
    headers: list[tuple[str, str]],
    body: bytes,
    reply: Reply | None,
    result: str,
    error: str,
    a0: float,
    started_at: datetime,
) -> LogRow:
    return {
        "endpoint_id": target.id,
        "wid": wid,
        "jti": jti,
        "kind": "policy",
        "event_type": event_type,
        "attempt": attempt,
        "url": target.url,
        "request_headers": redacted(headers),
        "request_body": body,
        "response_status": reply.status if reply is not None else None,
        "response_headers": [list(h) for h in reply.headers] if reply is not None else [],
        "response_body": reply.body[:LOG_RESPONSE_BYTES] if reply is not None else b"",
        "response_truncated": bool(reply is not None and (reply.truncated or len(reply.body) > LOG_RESPONSE_BYTES)),
        "duration_ms": int((time.monotonic() - a0) * 1000),
        "result": result,
        "error": error[:500],
        "started_at": started_at,
    }
