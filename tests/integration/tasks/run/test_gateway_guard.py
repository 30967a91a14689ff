"""Model endpoints chosen by repository admins or in personal keys go through the URL guard at
every connection (loopback, private and metadata addresses refused unless the operator
allow-lists them); the instance's own endpoints are the operator's and are not checked."""

import httpx
import pytest

from forge.core.settings import Settings
from tasks.core.repo_settings import ProviderAccess
from tasks.run.gateway import ChannelUnavailable, build_channel
from tasks.run.gateway.guard import EndpointRefused, allow_list, guarded_transport
from tests.support.gateway import OPENAI_KEY, Recorder, agent_client, open_channel, upstreams
from tests.support.openai_responses import ScriptedResponses, hang, parse_sse, text

REQUEST = {"model": "scripted", "input": "hi"}


async def test_a_repository_endpoint_on_loopback_is_refused_without_the_allow_list() -> None:
    with ScriptedResponses([text("never")], repeat_last=True) as api:
        rec = Recorder()
        for url in (api.url, api.url.replace("127.0.0.1", "localhost")):  # a literal, and a name resolving to it
            async with (
                open_channel(upstreams(openai_url=url, guarded=True), emit=rec) as ch,
                agent_client(ch) as c,
            ):
                r = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {ch.token}"})
            # A status the agents' CLIs do not retry (every call would be refused alike), in the
            # provider's shape, with forgehand's reason and the fix.
            assert r.status_code == 403, r.text
            assert r.headers["x-forgehand-gateway"] == "refused" and r.headers["x-should-retry"] == "false"
            error = r.json()["error"]
            assert (error["type"], error["code"]) == ("permission_error", "gateway_endpoint_refused")
            assert error["message"].startswith(f"forgehand refused the model endpoint {url}: ")
            assert "not a public address (loopback)" in error["message"]
            assert (
                "ask an instance admin to allow" in error["message"]
                and "FORGEHAND_MODEL_ALLOWED_HOSTS" in error["message"]
            )
            assert ch.endpoint_refused.is_set() and ch.refusal == error["message"]
        assert api.calls == []  # nothing was connected to
        assert [e.status for e in rec.model_calls()] == [403, 403]


async def test_the_same_endpoint_is_reached_when_allow_listed_streams_included() -> None:
    script = [text("through the guard", pieces=3), text("json too", input_tokens=7)]
    with ScriptedResponses(script) as api:
        ups = upstreams(openai_url=api.url, guarded=True)
        async with open_channel(ups, allowed_hosts="127.0.0.1", emit=(rec := Recorder())) as ch, agent_client(ch) as c:
            h = {"authorization": f"Bearer {ch.token}"}
            streamed = await c.post("/v1/responses", json={**REQUEST, "stream": True}, headers=h)
            plain = await c.post("/v1/responses", json=REQUEST, headers=h)
    assert streamed.status_code == 200 and parse_sse(streamed.text)[-1]["type"] == "response.completed"
    assert plain.status_code == 200 and plain.json()["output"][0]["content"][0]["text"] == "json too"
    assert [h["authorization"] for h in api.headers] == [f"Bearer {OPENAI_KEY}"] * 2
    assert [e.input_tokens for e in rec.model_calls()] == [10, 7]


async def test_an_unguarded_instance_endpoint_on_loopback_is_reached() -> None:
    with ScriptedResponses([text("operator's choice")]) as api:
        async with open_channel(upstreams(openai_url=api.url)) as ch, agent_client(ch) as c:
            r = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {ch.token}"})
    assert r.status_code == 200


async def test_a_guarded_endpoint_that_does_not_answer_times_out() -> None:
    with ScriptedResponses([hang()]) as api:
        ups = upstreams(openai_url=api.url, guarded=True, timeout=0.5)
        async with open_channel(ups, allowed_hosts="127.0.0.0/8") as ch, agent_client(ch) as c:
            r = await c.post("/v1/responses", json=REQUEST, headers={"authorization": f"Bearer {ch.token}"})
    assert r.status_code == 504 and r.headers["x-forgehand-gateway"] == "timeout"


@pytest.mark.parametrize(
    "addresses",
    [["10.1.2.3"], ["169.254.169.254"], ["93.184.216.34", "192.168.1.9"], ["::ffff:127.0.0.1"], ["fd00::1"]],
)
async def test_a_name_resolving_to_a_private_address_is_refused(addresses: list[str]) -> None:
    """Every address of the name is checked before any connection (a public first answer does
    not let a private second one through)."""
    asked: list[str] = []

    async def resolver(host: str, port: int) -> list[str]:
        asked.append(host)
        return addresses

    async with httpx.AsyncClient(transport=guarded_transport(allow_list(""), resolver)) as client:
        with pytest.raises(EndpointRefused) as caught:
            await client.post("http://llm.example:8000/v1/responses", json=REQUEST, timeout=5)
    assert asked == ["llm.example"]
    assert "llm.example resolves to" in str(caught.value) and "FORGEHAND_MODEL_ALLOWED_HOSTS" in str(caught.value)


def _access(base_url: str, *, trusted: bool) -> dict[str, ProviderAccess]:
    source = "instance" if trusted else "repository"
    return {
        "openai": ProviderAccess(
            provider="openai", base_url=base_url, api_key="k", model="m", source=source, trusted=trusted
        )
    }


def test_build_channel_guards_what_the_operator_did_not_choose(settings: Settings) -> None:
    emit = Recorder()
    repo = build_channel(settings, _access("http://127.0.0.1:1/v1", trusted=False), "openai",
                         task_id=1, run_id=1, run_uuid="u1", emit=emit)  # fmt: skip
    inst = build_channel(settings, _access("http://127.0.0.1:1/v1", trusted=True), "openai",
                         task_id=1, run_id=2, run_uuid="u2", emit=emit)  # fmt: skip
    assert repo.upstreams["openai"].guarded and not inst.upstreams["openai"].guarded
    bad = settings.__class__(
        **{**{f: getattr(settings, f) for f in settings.__struct_fields__}, "model_allowed_hosts": "not a host!"}
    )
    with pytest.raises(ChannelUnavailable, match="FORGEHAND_MODEL_ALLOWED_HOSTS"):
        build_channel(bad, _access("https://x.example/v1", trusted=False), "openai",
                      task_id=1, run_id=3, run_uuid="u3", emit=emit)  # fmt: skip
    for channel in (repo, inst):
        channel.registry.revoke(channel.token)
