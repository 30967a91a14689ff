"""The gateway's stream meter on the bytes as they pass: events split anywhere across chunks,
LF or CRLF line ends, the budget's stop just past a complete event, and bursts handed on whole."""

import json

from tasks.run.gateway.metering import AnthropicMeter, OpenAIMeter


def sse(kind: str, data: object) -> bytes:
    return f"event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


ANTHROPIC = b"".join(
    [
        sse(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "model": "claude-x",
                    "usage": {"input_tokens": 11, "cache_read_input_tokens": 5, "output_tokens": 1},
                },
            },
        ),
        sse("content_block_start", {"type": "content_block_start", "index": 0}),
        sse("ping", {"type": "ping"}),
        sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"text": "héllo wörld\n"}}),
        sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"partial_json": '{"a"'}}),
        sse("content_block_stop", {"type": "content_block_stop", "index": 0}),
        sse("content_block_start", {"type": "content_block_start", "index": 1}),
        sse("message_delta", {"type": "message_delta", "usage": {"output_tokens": 42}}),
        sse("message_stop", {"type": "message_stop"}),
    ]
)


def read(meter: AnthropicMeter) -> tuple[object, ...]:
    u = meter.usage
    return (meter.model, u.input_tokens, u.cache_read_tokens, u.output_tokens, meter.final_output,
            meter.streamed_chars, sorted(meter.open_blocks))  # fmt: skip


def test_an_anthropic_stream_reads_the_same_however_it_is_split_and_whatever_its_line_ends() -> None:
    whole = AnthropicMeter()
    assert whole.feed(ANTHROPIC) == (ANTHROPIC, False)
    assert read(whole) == ("claude-x", 11, 5, 42, True, len("héllo wörld\n") + len('{"a"'), [1])
    for body in (ANTHROPIC, ANTHROPIC.replace(b"\n", b"\r\n")):
        for cut in range(1, len(body)):
            meter = AnthropicMeter()
            first, _ = meter.feed(body[:cut])
            second, _ = meter.feed(body[cut:])
            assert first + second == body  # by whole events, untouched
            sep = b"\r\n\r\n" if b"\r" in body else b"\n\n"
            held = body[len(first) : cut]  # what waits: the start of one event, no whole one
            assert body.startswith(first) and (not first or first.endswith(sep)) and sep not in held
            assert read(meter) == read(whole), (cut, body[:cut])


def test_the_budget_stops_a_stream_just_past_the_event_that_reached_it() -> None:
    events = ANTHROPIC.split(b"\n\n")
    head = b"\n\n".join(events[:3]) + b'\n\nevent: content_block_delta\ndata: {"type": "content'
    rest = ANTHROPIC[len(head) :]
    meter = AnthropicMeter()
    sent, cut = meter.feed(head, lambda: meter.streamed_chars > 0)
    assert not cut and sent == b"\n\n".join(events[:3]) + b"\n\n"  # the delta is not complete yet
    more, cut = meter.feed(rest, lambda: meter.streamed_chars > 0)
    # The stream stops exactly after the first delta event, nothing of the next.
    assert cut and (sent + more).endswith(b'"delta": {"text": "h\\u00e9llo w\\u00f6rld\\n"}}\n\n')
    assert meter.streamed_chars == len("héllo wörld\n")


def test_openai_deltas_tool_arguments_and_usage_are_counted() -> None:
    chunks = [
        {"model": "gpt-x", "choices": [{"index": 0, "delta": {"content": "abcdef"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"function": {"arguments": '{"k": 1}'}}]}}]},
    ]
    body = b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks)
    meter = OpenAIMeter()
    assert meter.feed(body + b"data: not json\n\n") == (body + b"data: not json\n\n", False)
    assert (meter.model, meter.streamed_chars, meter.final_output) == ("gpt-x", 6 + 8, False)
    assert meter.estimated_total == 4  # ceil(14 / 4)
    usage = {"prompt_tokens": 30, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 10}}
    meter.feed(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
    assert (meter.usage.input_tokens, meter.usage.cache_read_tokens, meter.usage.output_tokens) == (20, 10, 9)
    assert meter.final_output and meter.estimated_total == 39
