"""The consumer SDK: verification in the contract's order with typed errors, routing, dedup, and
a corpus of mutated requests of which none is accepted and none raises anything unexpected."""

import base64
import hashlib
import hmac
import json
import random
import subprocess
import sys
import time
import uuid
from typing import Any

import jwt
import pytest

from webhooks import sdk as c
from webhooks.core.signing import SigningKey, sign_jwt
from webhooks.sdk.protocol import encode_secret, kid_for

KEY = bytes(range(32))
SECRET = encode_secret(KEY)
OTHER_KEY = bytes(range(1, 33))
AUD = "https://hooks.example.com/forgehand"
ISS = "fh-test-instance"
TASK = str(uuid.uuid4())


def envelope(event: str = "pre_tool_use", wid: str | None = None, **meta: Any) -> dict[str, Any]:
    m: dict[str, Any] = {
        "delivery_id": wid or str(uuid.uuid4()),
        "schema_version": 1,
        "instance": ISS,
        "repository": "ana/demo",
        "repository_uuid": "r-uuid",
        "task": {"id": TASK, "number": 3, "url": ""},
        "run": None,
        "actor": {"login": "ana", "type": "User"},
        "agent": None,
    }
    m.update(meta)
    return {"type": event, "meta": m, "data": {"tool_use_id": "t1", "tool_name": "bash", "tool_input": {"cmd": "ls"}}}


def request(
    env: dict[str, Any] | None = None,
    *,
    key: bytes = KEY,
    aud: str = AUD,
    body: bytes | None = None,
    now: int | None = None,
) -> tuple[list[tuple[str, str]], bytes]:
    env = env or envelope()
    raw = body if body is not None else json.dumps(env, separators=(",", ":")).encode()
    task = env["meta"].get("task")
    token, _ = sign_jwt(
        SigningKey(kid_for(key), key),
        issuer=ISS,
        subject=f"forgehand:task:{task['id']}" if task else f"forgehand:repo:{env['meta']['repository_uuid']}",
        audience=aud,
        wid=env["meta"]["delivery_id"],
        event_type=env["type"],
        body=raw,
        budget=5,
        now=now if now is not None else int(time.time()),
    )
    return [("Authorization", f"Bearer {token}"), ("Content-Type", "application/json")], raw


def forge_token(claims: dict[str, Any], *, key: bytes = KEY, alg: str = "HS256", **header: Any) -> str:
    head = {"kid": kid_for(key), "typ": "JWT", **header}
    return jwt.encode(claims, key, algorithm=alg, headers=head)


def good_claims(body: bytes, env: dict[str, Any]) -> dict[str, Any]:
    now = int(time.time())
    return {
        "iss": ISS,
        "sub": f"forgehand:task:{TASK}",
        "aud": AUD,
        "iat": now,
        "nbf": now - 30,
        "exp": now + 35,
        "jti": str(uuid.uuid4()),
        "wid": env["meta"]["delivery_id"],
        "type": env["type"],
        "body_sha256": hashlib.sha256(body).hexdigest(),
    }


def verifier(**kw: Any) -> c.Verifier:
    return c.Verifier(audience=kw.pop("audience", AUD), secrets=kw.pop("secrets", [SECRET]), issuer=ISS, **kw)


def test_a_genuine_request_verifies() -> None:
    headers, body = request()
    req = verifier().verify("POST", headers, body)
    assert req.type == "pre_tool_use" and req.data["tool_name"] == "bash" and req.task_id == TASK
    assert req.kid == kid_for(KEY)


def with_token(token: str, body: bytes) -> tuple[list[tuple[str, str]], bytes]:
    return [("Authorization", f"Bearer {token}")], body


def _case_claims(mutate: Any) -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    claims = good_claims(body, env)
    mutate(claims)
    return with_token(forge_token(claims), body)


def _drop(name: str) -> Any:
    return lambda cl: cl.pop(name)


def _set(name: str, value: Any) -> Any:
    return lambda cl: cl.__setitem__(name, value)


def _hs512() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    token = jwt.encode(
        good_claims(body, env), KEY + KEY, algorithm="HS512", headers={"kid": kid_for(KEY), "typ": "JWT"}
    )
    return with_token(token, body)


def _alg_none() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    seg = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()  # noqa: E731
    token = f"{seg({'alg': 'none', 'typ': 'JWT', 'kid': kid_for(KEY)})}.{seg(good_claims(body, env))}."
    return with_token(token + "x", body)


def _header(**header: Any) -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    return with_token(forge_token(good_claims(body, env), **header), body)


def _raw_header(header_json: bytes) -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    signing_input = f"{b64(header_json)}.{b64(json.dumps(good_claims(body, env)).encode())}"
    sig = b64(hmac.new(KEY, signing_input.encode(), hashlib.sha256).digest())
    return with_token(f"{signing_input}.{sig}", body)


def _other_key_same_kid() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    token = jwt.encode(
        good_claims(body, env), OTHER_KEY, algorithm="HS256", headers={"kid": kid_for(KEY), "typ": "JWT"}
    )
    return with_token(token, body)


def _body(env: dict[str, Any], **kw: Any) -> tuple[list[tuple[str, str]], bytes]:
    return request(env, **kw)


def _tampered_body() -> tuple[list[tuple[str, str]], bytes]:
    headers, body = request()
    return headers, body.replace(b'"ls"', b'"rm -rf /"')


def _sub_mismatch() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    return with_token(forge_token({**good_claims(body, env), "sub": f"forgehand:task:{uuid.uuid4()}"}), body)


def _type_mismatch() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    return with_token(forge_token({**good_claims(body, env), "type": "pre_merge"}), body)


def _wid_mismatch() -> tuple[list[tuple[str, str]], bytes]:
    env = envelope()
    body = json.dumps(env).encode()
    return with_token(forge_token({**good_claims(body, env), "wid": str(uuid.uuid4())}), body)


def _now() -> int:
    # At call time: the cases run long after collection in a full suite.
    return int(time.time())


CASES: dict[str, tuple[Any, type[c.VerificationError]]] = {
    "HS512": (_hs512, c.UnsupportedAlgorithm),
    "alg none": (_alg_none, c.UnsupportedAlgorithm),
    "typ JOSE": (lambda: _header(typ="JOSE"), c.UnsupportedAlgorithm),
    "typ jwt lowercase": (lambda: _header(typ="jwt"), c.UnsupportedAlgorithm),
    "duplicate alg in header": (
        lambda: _raw_header(b'{"alg":"none","alg":"HS256","typ":"JWT","kid":"' + kid_for(KEY).encode() + b'"}'),
        c.MalformedToken,
    ),
    "unknown kid": (lambda: _header(kid="k0000000000000000"), c.UnknownKey),
    "kid not a string": (lambda: _raw_header(b'{"alg":"HS256","typ":"JWT","kid":7}'), c.UnknownKey),
    "signed with another key": (_other_key_same_kid, c.BadSignature),
    **{
        f"missing {n}": ((lambda n=n: _case_claims(_drop(n))), c.MissingClaim)
        for n in ("iss", "sub", "aud", "iat", "nbf", "exp", "jti", "wid", "type", "body_sha256")
    },
    "iat as string": (lambda: _case_claims(_set("iat", str(_now()))), c.InvalidClaim),
    "exp as float": (lambda: _case_claims(_set("exp", _now() + 30.5)), c.InvalidClaim),
    "nbf as bool": (lambda: _case_claims(_set("nbf", True)), c.InvalidClaim),
    "aud as list": (lambda: _case_claims(_set("aud", [AUD])), c.InvalidClaim),
    "empty jti": (lambda: _case_claims(_set("jti", "")), c.InvalidClaim),
    "expired": (
        lambda: _case_claims(lambda cl: cl.update(iat=_now() - 100, nbf=_now() - 130, exp=_now() - 60)),
        c.Expired,
    ),
    "not yet valid": (
        lambda: _case_claims(lambda cl: cl.update(iat=_now() + 100, nbf=_now() + 70, exp=_now() + 200)),
        c.NotYetValid,
    ),
    "nbf after exp": (lambda: _case_claims(lambda cl: cl.update(nbf=_now(), exp=_now() - 1)), c.InvalidClaim),
    "wrong issuer": (lambda: _case_claims(_set("iss", "fh-somebody-else")), c.WrongIssuer),
    "body hash mismatch": (_tampered_body, c.BindingMismatch),
    "wrong audience": (lambda: request(aud="https://evil.example.com/forgehand"), c.WrongAudience),
    "audience differs by path slash": (lambda: request(aud=AUD + "/"), c.WrongAudience),
    "schema_version 2": (lambda: _body(envelope(schema_version=2)), c.UnsupportedSchema),
    "schema_version missing": (lambda: _body(envelope(schema_version=None)), c.UnsupportedSchema),
    "wid not meta.delivery_id": (_wid_mismatch, c.BindingMismatch),
    "type not the token's": (_type_mismatch, c.BindingMismatch),
    "sub not the task": (_sub_mismatch, c.BindingMismatch),
    "body not JSON": (lambda: request(body=b"not json"), c.MalformedBody),
    "body with duplicate keys": (lambda: request(body=b'{"type":"x","type":"y","meta":{},"data":{}}'), c.MalformedBody),
    "body is an array": (lambda: request(body=b"[]"), c.MalformedBody),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_refusal_has_its_typed_error(case: str) -> None:
    make, error = CASES[case]
    headers, body = make()
    with pytest.raises(error):
        verifier().verify("POST", headers, body)


def test_transport_level_refusals() -> None:
    headers, body = request()
    v = verifier()
    with pytest.raises(c.MethodNotAllowed):
        v.verify("GET", headers, body)
    with pytest.raises(c.MissingToken):
        v.verify("POST", [("Content-Type", "application/json")], body)
    with pytest.raises(c.MissingToken):
        v.verify("POST", [("Authorization", "Basic " + base64.b64encode(b"a:b").decode())], body)
    with pytest.raises(c.MissingToken):
        v.verify("POST", [*headers, ("authorization", headers[0][1])], body)
    with pytest.raises(c.MalformedToken):
        v.verify("POST", [("Authorization", "Bearer a.b")], body)


def test_issuer_is_only_checked_when_configured() -> None:
    headers, body = _case_claims(_set("iss", "fh-other"))
    assert c.Verifier(audience=AUD, secrets=SECRET).verify("POST", headers, body)


def test_audience_comes_from_configuration_never_from_host_or_forwarded_headers() -> None:
    spoof = [
        ("Host", "evil.example.com"),
        ("X-Forwarded-Host", "evil.example.com"),
        ("Forwarded", "host=evil.example.com;proto=https"),
        ("X-Forwarded-Proto", "https"),
    ]
    headers, body = request(aud="https://evil.example.com/forgehand")
    with pytest.raises(c.WrongAudience):
        verifier().verify("POST", headers + spoof, body)
    headers, body = request()  # issued for the configured audience: the Host header does not matter
    assert verifier().verify("POST", headers + spoof, body)


def test_trailing_slash_on_an_empty_path_is_one_audience() -> None:
    headers, body = request(aud="https://hooks.example.com/")
    assert c.Verifier(audience="https://hooks.example.com", secrets=SECRET).verify("POST", headers, body)
    headers, body = request(aud="https://hooks.example.com")
    assert c.Verifier(audience="https://hooks.example.com/", secrets=SECRET).verify("POST", headers, body)


def test_eleven_mebibyte_body_is_413_but_only_after_the_token() -> None:
    env = envelope()
    big = json.dumps({**env, "data": {"blob": "x" * (11 * 1024 * 1024)}}).encode()
    headers, _ = request(env, body=big)
    with pytest.raises(c.BodyTooLarge) as info:
        verifier().verify("POST", headers, big)
    assert info.value.status == 413
    with pytest.raises(c.MissingToken):
        verifier().verify("POST", [], big)


def test_short_secret_is_refused_at_configuration() -> None:
    with pytest.raises(ValueError, match="at least 32 bytes"):
        c.Verifier(audience=AUD, secrets=encode_secret(b"x" * 16))
    with pytest.raises(ValueError):
        c.Verifier(audience=AUD, secrets="not-a-whsec")
    with pytest.raises(ValueError):
        c.Verifier(audience=AUD, secrets=[])


def test_rotation_two_secrets_both_verify() -> None:
    both = c.Verifier(audience=AUD, secrets=[SECRET, encode_secret(OTHER_KEY)])
    for key in (KEY, OTHER_KEY):
        headers, body = request(key=key)
        assert both.verify("POST", headers, body).kid == kid_for(key)
    only_old = c.Verifier(audience=AUD, secrets=[SECRET])
    headers, body = request(key=OTHER_KEY)
    with pytest.raises(c.UnknownKey):
        only_old.verify("POST", headers, body)


def test_repository_event_subject() -> None:
    env = envelope("repo.pushed", task=None)
    headers, body = request(env)
    assert verifier().verify("POST", headers, body).type == "repo.pushed"


# -- corpus -------------------------------------------------------------------------------------


def _b64decode(seg: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4))
    except Exception:
        return None


def _sign_raw(header: dict[str, Any], claims: dict[str, Any], key: bytes) -> str:
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{b64(hmac.new(key, signing_input.encode(), hashlib.sha256).digest())}"


def _mutations(
    rng: random.Random, headers: list[tuple[str, str]], body: bytes
) -> tuple[str, list[tuple[str, str]], bytes]:
    token = headers[0][1][7:]
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ \x00\u00e9"
    kind = rng.randrange(12)
    method = "POST"
    if kind == 0:  # replace one character of the token
        i = rng.randrange(len(token))
        token = token[:i] + rng.choice(alphabet) + token[i + 1 :]
    elif kind == 1:  # delete a span of the token
        i = rng.randrange(len(token))
        token = token[:i] + token[i + rng.randint(1, 20) :]
    elif kind == 2:  # swap segments
        parts = token.split(".")
        rng.shuffle(parts)
        token = ".".join(parts)
    elif kind == 3:  # flip a byte of the body
        i = rng.randrange(len(body))
        body = body[:i] + bytes([body[i] ^ (1 << rng.randrange(8))]) + body[i + 1 :]
    elif kind == 4:  # truncate or extend the body
        body = (
            body[: rng.randrange(len(body))] if rng.random() < 0.5 else body + rng.choice([b" ", b"{}", b"\x00", b"x"])
        )
    elif kind == 5:  # random garbage token
        token = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 200)))
    elif kind == 6:  # re-signed by an attacker with claims changed
        claims = json.loads(_b64decode(token.split(".")[1]) or b"{}")
        name = rng.choice(list(claims))
        claims[name] = rng.choice([None, 0, "", "x", [], {}, -1, 2**70, claims[name]])
        token = _sign_raw({"alg": "HS256", "typ": "JWT", "kid": kid_for(KEY)}, claims, rng.randbytes(32))
    elif kind == 7:  # header segment replaced by arbitrary JSON
        junk = rng.choice(
            [b"null", b"[]", b'{"alg":"HS256"}', b'{"alg":"HS256","typ":"JWT","kid":null}', b"{", b"\xff"]
        )
        seg = base64.urlsafe_b64encode(junk).rstrip(b"=").decode()
        token = seg + "." + token.split(".", 1)[1]
    elif kind == 8:  # scheme games
        headers = [
            (
                "Authorization",
                rng.choice(["bearer", "Bearer", "BEARER", "Token", ""]) + rng.choice(["", " ", "  "]) + token,
            )
        ]
        if rng.random() < 0.5:
            body = body + b"x"
        return "POST", headers, body
    elif kind == 9:  # another method
        method = rng.choice(["GET", "PUT", "post", "", "POST "])
        return method, headers, body + b" "
    elif kind == 10:  # claims segment replaced, signature kept
        claims = json.loads(_b64decode(token.split(".")[1]) or b"{}")
        claims["aud"] = rng.choice(["https://evil.example.com/", AUD + "x", AUD.upper()])
        parts = token.split(".")
        parts[1] = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
        token = ".".join(parts)
    else:  # header values of odd types / bytes
        return "POST", [(b"authorization", ("Bearer " + token).encode() + bytes([rng.randrange(256)]))], body  # type: ignore[list-item]
    return method, [("Authorization", "Bearer " + token)], body


def _same_as_original(
    orig_headers: list[tuple[str, str]], orig_body: bytes, method: str, headers: Any, body: bytes
) -> bool:
    if method != "POST" or body != orig_body or len(headers) != 1:
        return False
    value = headers[0][1]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    scheme, _, token = value.strip(" \t").partition(" ")
    if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 7235): same request
        return False
    a, b = orig_headers[0][1][7:].split("."), token.strip(" \t").split(".")
    return len(a) == len(b) == 3 and all(
        _b64decode(x) == _b64decode(y) and _b64decode(y) is not None for x, y in zip(a, b, strict=True)
    )


def test_mutation_corpus_nothing_accepted_nothing_unhandled() -> None:
    rng = random.Random(20261129)
    v = verifier()
    handler = c.Consumer(v, policy={"pre_tool_use": lambda r: c.allow()})
    tried = 0
    while tried < 1500:
        headers, body = request()
        method, mutated, mbody = _mutations(rng, headers, body)
        if _same_as_original(headers, body, method, mutated, mbody):
            continue  # a no-op mutation (e.g. unused base64 bits) is the genuine request
        tried += 1
        with pytest.raises(c.VerificationError):
            v.verify(method, mutated, mbody)
        response = handler.handle(method, mutated, mbody)
        assert response.status in {400, 401, 405, 413}, (method, mutated, mbody[:80])


# -- routing ------------------------------------------------------------------------------------


def test_encode_failure_is_a_500_never_an_empty_200() -> None:
    for bad in ({"model_context": float("nan")}, {"x": object()}, {"s": "\ud800"}):
        consumer = c.Consumer(verifier(), policy={"pre_tool_use": lambda r, bad=bad: bad})
        headers, body = request()
        response = consumer.handle("POST", headers, body)
        assert response.status == 500 and response.body
        assert json.loads(response.body)["error"] == "encode_failed"

    def boom(_: c.HookRequest) -> None:
        raise RuntimeError("consumer bug")

    headers, body = request()
    response = c.Consumer(verifier(), policy={"pre_tool_use": boom}).handle("POST", headers, body)
    assert response.status == 500 and json.loads(response.body)["error"] == "callback_failed"


def test_routes_and_deduplicates_on_wid() -> None:
    calls: list[str] = []

    def tool(req: c.HookRequest) -> dict[str, Any]:
        calls.append(req.jti)
        return c.deny(f"call {len(calls)}")

    notes: list[str] = []
    consumer = c.Consumer(verifier(), policy={"pre_tool_use": tool}, notify=lambda r: notes.append(r.wid))
    env = envelope()
    first = consumer.handle("POST", *request(env))
    again = consumer.handle("POST", *request(env))  # a retry: new jti, same wid and body
    assert first.status == again.status == 200
    assert json.loads(first.body) == json.loads(again.body) == {"permission": {"decision": "deny", "reason": "call 1"}}
    assert len(calls) == 1

    note = envelope("task.created")
    assert consumer.handle("POST", *request(note)).status == 204
    assert consumer.handle("POST", *request(note)).status == 204
    assert notes == [note["meta"]["delivery_id"]]
    # An event nobody handles gets an empty 200 (no opinion).
    response = consumer.handle("POST", *request(envelope("stop")))
    assert (response.status, response.body) == (200, b"")


async def test_asgi_adapter_answers_and_refuses() -> None:
    consumer = c.Consumer(verifier(), policy={"pre_tool_use": lambda r: c.ask("person please")})
    headers, body = request()

    async def call(hdrs: list[tuple[str, str]], payload: bytes) -> tuple[int, bytes]:
        sent: list[dict[str, Any]] = []
        chunks = [{"type": "http.request", "body": payload, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return chunks.pop(0)

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "headers": [(k.lower().encode(), v.encode()) for k, v in hdrs]}
        await consumer.asgi(scope, receive, send)
        return sent[0]["status"], sent[1]["body"]

    status, payload = await call(headers, body)
    assert status == 200 and json.loads(payload)["permission"]["decision"] == "ask"
    status, _ = await call([], body)
    assert status == 401


def test_sdk_imports_with_only_pyjwt_and_the_standard_library() -> None:
    code = """
import sys
BLOCKED = ("forge", "litestar", "sqlalchemy", "msgspec", "httpx", "httpcore", "anyio", "structlog", "click",
           "prometheus_client")
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Block())
from webhooks.sdk import Consumer, Verifier, deny
from webhooks.sdk.reference import make_consumer
v = Verifier(audience="https://h.example/x", secrets="whsec_" + "A" * 44)
print("ok", Consumer(v).verifier is v)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok True"


def test_the_worked_example_in_the_docs_verifies() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[3] / "docs" / "webhooks.md").read_text(encoding="utf-8")
    body = next(line for line in doc.splitlines() if line.startswith('{"type":"task.created"')).encode()
    token = doc.split("\nAuthorization: Bearer ", 1)[1].split()[0]
    signature = doc.split("\nwebhook-signature: ", 1)[1].split()[0]
    secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
    v = c.Verifier(
        audience="https://hooks.example.com/forgehand",
        secrets=secret,
        issuer="fh-3c9a1f0e2b7d4a61",
        clock=lambda: 1795946400,
    )
    req = v.verify("POST", [("Authorization", f"Bearer {token}")], body)
    assert (req.kid, req.wid, req.type) == ("k5294a2b257e06e72", "5f0c1c52-8a44-4a5e-9d59-0d1f5a3e7c21", "task.created")
    signed = b"5f0c1c52-8a44-4a5e-9d59-0d1f5a3e7c21.1795946400." + body
    expected = base64.b64encode(hmac.new(bytes(range(32)), signed, hashlib.sha256).digest()).decode()
    assert signature == f"v1,{expected}"
