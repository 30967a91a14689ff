"""The scripted Anthropic server frames its answers as the real Messages API does (other tests and the
Claude Code CLI rely on it)."""

import json
import time

import httpx
import pytest

from tests.support.anthropic import ScriptedAnthropic, hang, parse_sse, slow, status, text, tool_use, turn


def test_stream_is_framed_like_the_real_api() -> None:
    script = [turn(text("let me look", pieces=2), tool_use("Bash", {"command": "ls -la"}, "toolu_x"))]
    with ScriptedAnthropic(script) as api:
        with httpx.Client(timeout=5) as client:
            response = client.post(
                f"{api.url}/v1/messages?beta=true",
                headers={"x-api-key": "sk-real", "anthropic-version": "2023-06-01"},
                json={"model": "claude-any", "max_tokens": 64, "stream": True, "messages": []},
            )
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["transfer-encoding"] == "chunked"
        events = parse_sse(response.text)
        names = [name for name, _ in events]
        assert names[:2] == ["message_start", "ping"]
        assert names[-2:] == ["message_delta", "message_stop"]
        assert all(data["type"] == name for name, data in events)
        start = events[0][1]["message"]
        assert start["model"] == "claude-any"
        assert set(start["usage"]) >= {"input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"}
        texts = [d["delta"]["text"] for n, d in events if n == "content_block_delta" and d["index"] == 0]
        assert len(texts) == 2 and "".join(texts) == "let me look"
        blocks = [d["content_block"] for n, d in events if n == "content_block_start"]
        assert blocks[1] == {"type": "tool_use", "id": "toolu_x", "name": "Bash", "input": {}}
        partial = [d["delta"]["partial_json"] for n, d in events if n == "content_block_delta" and d["index"] == 1]
        assert json.loads("".join(partial)) == {"command": "ls -la"}
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        assert events[-2][1]["usage"]["output_tokens"] == 5
        assert api.messages[0].query == {"beta": "true"}
        assert api.headers[0]["x-api-key"] == "sk-real"


def test_json_answer_when_not_streaming_and_errors_in_the_provider_shape() -> None:
    script = [text("hi", output_tokens=7), status(429, retry_after=3), status(500)]
    with ScriptedAnthropic(script) as api, httpx.Client(base_url=api.url, timeout=5) as client:
        body = {"model": "m", "max_tokens": 8, "messages": []}
        first = client.post("/v1/messages", json=body).json()
        limited = client.post("/v1/messages", json=body)
        broken = client.post("/v1/messages", json=body)
        exhausted = client.post("/v1/messages", json=body)
    assert first["content"] == [{"type": "text", "text": "hi"}]
    assert first["usage"]["output_tokens"] == 7 and first["stop_reason"] == "end_turn"
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    assert limited.json()["error"]["type"] == "rate_limit_error"
    assert broken.status_code == 500 and broken.json()["type"] == "error"
    assert exhausted.status_code == 500  # the script ran out: a test sees it, never a hang


def test_slow_and_hang() -> None:
    with ScriptedAnthropic([slow(0.3), hang()]) as api:
        with httpx.Client(base_url=api.url, timeout=5) as client:
            began = time.monotonic()
            assert client.post("/v1/messages", json={"model": "m"}).status_code == 200
            assert time.monotonic() - began >= 0.3
        with httpx.Client(base_url=api.url, timeout=0.5) as client, pytest.raises(httpx.ReadTimeout):
            client.post("/v1/messages", json={"model": "m"})
