"""The scripted OpenAI Responses server frames its answers as the real Responses API does (the
gateway's tests and the Codex CLI rely on it)."""

import json
import time

import httpx
import pytest

from tests.support.openai_responses import (
    ScriptedResponses,
    custom_tool_call,
    error_event,
    failed,
    function_call,
    hang,
    parse_sse,
    reasoning,
    slow,
    status,
    text,
    turn,
)

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hi\n*** End Patch\n"


def _post(api: ScriptedResponses, body: dict[str, object], timeout: float = 5) -> httpx.Response:
    with httpx.Client(timeout=timeout) as client:
        return client.post(f"{api.url}/responses", headers={"authorization": "Bearer sk-real"}, json=body)


def test_stream_is_framed_like_the_real_api() -> None:
    script = [
        turn(
            text("let me look", pieces=2, input_tokens=40, cached_tokens=30, output_tokens=9),
            function_call("exec_command", {"cmd": "ls -la"}, "call_x"),
            custom_tool_call("apply_patch", PATCH, "call_p"),
        )
    ]
    with ScriptedResponses(script) as api:
        response = _post(api, {"model": "gpt-any", "stream": True, "input": []})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["transfer-encoding"] == "chunked"
    events = parse_sse(response.text)
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["response"]["model"] == "gpt-any" and events[0]["response"]["status"] == "in_progress"
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) == 2 and "".join(deltas) == "let me look"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done[0]["type"] == "message" and done[0]["role"] == "assistant"
    assert done[0]["content"][0] == {"type": "output_text", "text": "let me look", "annotations": [], "logprobs": []}
    assert done[1]["type"] == "function_call" and done[1]["call_id"] == "call_x" and done[1]["name"] == "exec_command"
    assert isinstance(done[1]["arguments"], str) and json.loads(done[1]["arguments"]) == {"cmd": "ls -la"}
    pieces = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert json.loads("".join(pieces)) == {"cmd": "ls -la"}
    assert done[2] == {
        "id": done[2]["id"],
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_p",
        "name": "apply_patch",
        "input": PATCH,
    }
    inputs = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(inputs) == PATCH
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]
    completed = events[-1]["response"]
    assert completed["id"].startswith("resp_") and completed["status"] == "completed"
    assert completed["usage"] == {
        "input_tokens": 40,
        "input_tokens_details": {"cached_tokens": 30},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 49,
    }
    assert [item["type"] for item in completed["output"]] == ["message", "function_call", "custom_tool_call"]
    assert api.headers[0]["authorization"] == "Bearer sk-real"
    assert api.requests[0]["model"] == "gpt-any"


def test_reasoning_is_streamed_and_counted_in_output() -> None:
    with ScriptedResponses([reasoning("thinking it over", text("ok", output_tokens=4), reasoning_tokens=6)]) as api:
        events = parse_sse(_post(api, {"model": "m", "stream": True}).text)
    summary = [e for e in events if e["type"] == "response.reasoning_summary_text.delta"]
    assert "".join(e["delta"] for e in summary) == "thinking it over"
    assert all(e["summary_index"] == 0 for e in summary)
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens"] == 10 and usage["output_tokens_details"] == {"reasoning_tokens": 6}


def test_json_answer_when_not_streaming_and_errors_in_the_provider_shape() -> None:
    script = [function_call("shell", {"command": ["ls"]}, "call_j"), status(429, retry_after=3), status(500)]
    with ScriptedResponses(script) as api:
        first = _post(api, {"model": "m", "input": "hi"})
        limited = _post(api, {"model": "m"})
        broken = _post(api, {"model": "m"})
        exhausted = _post(api, {"model": "m"})
    body = first.json()
    assert first.headers["content-type"] == "application/json"
    assert body["object"] == "response" and body["status"] == "completed"
    call = body["output"][0]
    assert call["call_id"] == "call_j" and json.loads(call["arguments"]) == {"command": ["ls"]}
    assert body["usage"]["total_tokens"] == 15
    assert limited.status_code == 429 and limited.headers["retry-after"] == "3"
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    assert broken.status_code == 500 and broken.json()["error"]["type"] == "server_error"
    assert exhausted.status_code == 500  # the script ran out: a test sees it, never a hang


def test_failed_and_error_endings() -> None:
    limited = "Rate limit reached. Please try again in 1.5s."
    script = [failed("rate_limit_exceeded", limited), error_event("boom", "bad")]
    with ScriptedResponses(script) as api:
        failing = parse_sse(_post(api, {"model": "m", "stream": True}).text)
        erroring = parse_sse(_post(api, {"model": "m", "stream": True}).text)
    assert failing[-1]["type"] == "response.failed"
    assert failing[-1]["response"]["error"] == {
        "code": "rate_limit_exceeded",
        "message": limited,
    }
    assert erroring[-1]["type"] == "error" and erroring[-1]["code"] == "boom"
    assert "response.completed" not in [e["type"] for e in failing + erroring]


def test_slow_and_hang() -> None:
    with ScriptedResponses([slow(0.3), hang()]) as api:
        t0 = time.monotonic()
        assert _post(api, {"model": "m"}).status_code == 200
        assert time.monotonic() - t0 >= 0.3
        with pytest.raises(httpx.ReadTimeout):
            _post(api, {"model": "m"}, timeout=0.5)
        assert len(api.responses) == 2
