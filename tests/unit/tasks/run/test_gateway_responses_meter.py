"""The Responses meter on the bytes as they pass: events split anywhere across chunks, frames with
or without an `event:` line, cached input and reasoning read from `response.completed`, the
estimate while streaming, and the ends the gateway writes (cut, broken) in the API's framing."""

import json

from tasks.run.gateway.responses import ResponsesMeter, stream_end, stream_error
from tests.support.openai_responses import custom_tool_call, frame, parse_sse, reasoning, sse_events, text, turn

SCRIPT = reasoning(
    "thinking",
    turn(
        text("hello wörld", input_tokens=300, cached_tokens=120, output_tokens=40),
        custom_tool_call("apply_patch", "*** Begin Patch\n*** End Patch\n"),
    ),
    reasoning_tokens=9,
)


def stream() -> bytes:
    return b"".join(frame(e) for e in sse_events(SCRIPT, "gpt-x"))


def test_usage_from_the_completed_event_whatever_the_chunking() -> None:
    body = stream()
    for size in (1, 7, 64, len(body)):
        meter = ResponsesMeter()
        out = b""
        for i in range(0, len(body), size):
            passed, cut = meter.feed(body[i : i + size])
            out += passed
            assert not cut
        out += meter.rest()
        assert out == body  # the bytes pass untouched
        assert (meter.usage.input_tokens, meter.usage.cache_read_tokens, meter.usage.output_tokens) == (180, 120, 49)
        assert meter.final_output and meter.model == "gpt-x" and meter.response_id.startswith("resp_")
        assert meter.events == len(parse_sse(body.decode()))


def test_frames_without_event_lines_and_the_estimate_while_streaming() -> None:
    events = sse_events(text("x" * 400, pieces=4), "gpt-x")
    bare = b"".join(f"data: {json.dumps(e)}\r\n\r\n".encode() for e in events[:-1])  # no response.completed
    meter = ResponsesMeter()
    meter.feed(bare)
    assert not meter.final_output and meter.streamed_chars == 400
    assert meter.estimated_total == 100  # output estimated from the deltas; input comes only at the end


def test_the_gateway_endings_continue_the_sequence_in_the_api_framing() -> None:
    meter = ResponsesMeter()
    events = sse_events(text("y" * 40), "gpt-x")
    meter.feed(b"".join(frame(e) for e in events[:5]))
    (cut,) = parse_sse(stream_end(meter).decode())
    assert cut["type"] == "response.incomplete" and cut["sequence_number"] == 5
    assert cut["response"]["id"] == events[0]["response"]["id"] and cut["response"]["status"] == "incomplete"
    assert cut["response"]["usage"]["output_tokens"] == meter.estimated_total
    (broken,) = parse_sse(stream_error(meter, "gone").decode())
    assert broken["type"] == "response.failed" and broken["response"]["error"] == {
        "code": "server_error",
        "message": "gone",
    }
