"""Signing and the retry schedule: our notification headers pass the independent Standard Webhooks
verifier, the JWT carries every claim, and retries are never early."""

import hashlib
import json
import random
import time
from datetime import UTC, datetime, timedelta

import jwt
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from webhooks.core.signing import SigningKey, new_secret, redacted, request_headers, sign_jwt
from webhooks.delivery.schedule import RETRY_SCHEDULE, parse_retry_after, retry_delay
from webhooks.sdk.protocol import decode_secret, encode_secret, kid_for, normalize_audience


def test_new_secret_is_32_bytes_shown_as_whsec_and_kid_is_derived() -> None:
    key, shown = new_secret()
    assert shown.startswith("whsec_") and decode_secret(shown) == key.key and len(key.key) == 32
    assert key.kid == kid_for(key.key) and key.kid != kid_for(new_secret()[0].key)


def test_jwt_header_and_claims() -> None:
    key, _ = new_secret()
    body = b'{"type":"pre_tool_use"}'
    token, jti = sign_jwt(
        key,
        issuer="fh-1",
        subject="forgehand:task:t",
        audience="https://h.example/",
        wid="w1",
        event_type="pre_tool_use",
        body=body,
        budget=5,
        now=1_000_000,
    )
    header = jwt.get_unverified_header(token)
    assert header == {"alg": "HS256", "typ": "JWT", "kid": key.kid}
    claims = jwt.decode(
        token,
        key.key,
        algorithms=["HS256"],
        options={"verify_exp": False, "verify_nbf": False, "verify_iat": False, "verify_aud": False},
    )
    assert claims == {
        "iss": "fh-1",
        "sub": "forgehand:task:t",
        "aud": "https://h.example",
        "iat": 1_000_000,
        "nbf": 1_000_000 - 30,
        "exp": 1_000_000 + 5 + 30,
        "jti": jti,
        "wid": "w1",
        "type": "pre_tool_use",
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }
    assert normalize_audience("https://h.example/a/") == "https://h.example/a/"


def test_notification_headers_pass_the_standardwebhooks_verifier_with_each_secret() -> None:
    current, current_shown = new_secret()
    nxt, next_shown = new_secret()
    body = json.dumps({"type": "task.created", "meta": {}, "data": {"x": "é"}}, ensure_ascii=False).encode()
    now = int(time.time())
    headers = dict(
        request_headers(
            token="t",
            event_type="task.created",
            wid="wid-1",
            notification_keys=[current, nxt],
            timestamp=now,
            body=body,
        )
    )
    assert headers["webhook-id"] == "wid-1" and headers["Forgehand-Delivery"] == "wid-1"
    assert headers["Forgehand-Event"] == "task.created" and headers["User-Agent"].startswith("forgehand/")
    for shown in (current_shown, next_shown):
        assert Webhook(shown).verify(body, headers) == json.loads(body)
    with pytest.raises(WebhookVerificationError):
        Webhook(encode_secret(bytes(32))).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(current_shown).verify(body + b" ", headers)
    # Policy calls carry no Standard Webhooks headers.
    plain = dict(
        request_headers(token="t", event_type="pre_tool_use", wid="w", notification_keys=None, timestamp=now, body=body)
    )
    assert "webhook-signature" not in plain


def test_log_copy_of_headers_hides_signatures() -> None:
    key = SigningKey("k1", bytes(32))
    token, _ = sign_jwt(
        key,
        issuer="i",
        subject="s",
        audience="https://a.example",
        wid="w",
        event_type="ping",
        body=b"{}",
        budget=15,
        now=int(time.time()),
    )
    rows = dict(
        redacted(
            request_headers(token=token, event_type="ping", wid="w", notification_keys=[key], timestamp=1, body=b"{}")
        )
    )
    assert token.rsplit(".", 1)[1] not in rows["Authorization"] and rows["Authorization"].endswith(
        "<signature redacted>"
    )
    assert rows["webhook-signature"] == "v1,<redacted>"


def test_retry_schedule_with_jitter_is_never_early_and_at_most_20_percent_late() -> None:
    rng = random.Random(7)
    assert RETRY_SCHEDULE == (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
    for attempt, base in enumerate(RETRY_SCHEDULE, start=1):
        delays = [retry_delay(attempt, None, rng) for _ in range(200)]
        assert all(d is not None and base <= d <= base * 1.2 for d in delays)
        assert max(d for d in delays if d is not None) > base * 1.1  # the jitter is real
    assert retry_delay(len(RETRY_SCHEDULE) + 1, None, rng) is None


def test_retry_after_is_honoured_within_base_and_twice_base() -> None:
    rng = random.Random(1)
    assert retry_delay(2, 10, rng) == 300  # too soon: the schedule's base
    assert retry_delay(2, 450, rng) == 450  # inside the window: as asked
    assert retry_delay(2, 10_000, rng) == 600  # too late: at most twice the base
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert parse_retry_after("120", now) == 120
    assert parse_retry_after((now + timedelta(minutes=7)).strftime("%a, %d %b %Y %H:%M:%S GMT"), now) == 420
    assert parse_retry_after("soon", now) is None and parse_retry_after(None, now) is None


def _token(key: SigningKey, subject: str) -> tuple[str, str]:
    args = {"issuer": "fh-1", "audience": "https://h.example/", "wid": "w1", "event_type": "stop", "body": b"{}"}
    return sign_jwt(key, subject=subject, budget=5, now=1_000_000, **args)  # type: ignore[arg-type]


def test_tokens_are_pyjwt_tokens_byte_for_byte_and_keys_are_still_checked() -> None:
    # The one encoder built once gives exactly what `jwt.encode` gives, for every key (current and
    # next during a rotation), including a non-ASCII subject.
    for key in (new_secret()[0], new_secret()[0]):
        for subject in ("forgehand:task:t", "forgehand:repo:é"):
            token, jti = _token(key, subject)
            claims = jwt.decode(token, options={"verify_signature": False})
            assert claims["jti"] == jti and claims["sub"] == subject
            assert token == jwt.encode(claims, key.key, algorithm="HS256", headers={"kid": key.kid})
    # PyJWT's refusal of secrets that are really asymmetric keys or JWKs still holds (checked once
    # per key, not skipped).
    for bad in (b"-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n", b'{"kty": "oct", "k": "aaaa"}'):
        for _ in range(2):
            with pytest.raises(jwt.InvalidKeyError):
                _token(SigningKey("k", bad), "s")
