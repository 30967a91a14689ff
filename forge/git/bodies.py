"""Request bodies of smart HTTP: size caps and streaming gzip decoding (no gzip bombs)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator

from forge.git.errors import PushTooLarge, UnsupportedEncoding

CHUNK_SIZE = 64 * 1024


async def limit_stream(body: AsyncIterator[bytes], max_bytes: int) -> AsyncIterator[bytes]:
    """Pass ``body`` through, raising ``PushTooLarge`` past ``max_bytes``."""
    total = 0
    async for chunk in body:
        total += len(chunk)
        if total > max_bytes:
            raise PushTooLarge(max_bytes)
        yield chunk


async def gunzip_stream(
    body: AsyncIterator[bytes], *, max_bytes: int, chunk_size: int = CHUNK_SIZE
) -> AsyncIterator[bytes]:
    """Decode a gzip body incrementally; the output is capped at ``max_bytes`` (no gzip bombs)."""
    decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    total = 0
    finished = False
    async for chunk in body:
        if finished:
            if chunk.strip(b"\0"):
                raise UnsupportedEncoding("data after the end of the gzip stream")
            continue
        data = chunk
        while data:
            try:
                out = decoder.decompress(data, chunk_size)
            except zlib.error as exc:
                raise UnsupportedEncoding(f"invalid gzip body: {exc}") from exc
            total += len(out)
            if total > max_bytes:
                raise PushTooLarge(max_bytes)
            if out:
                yield out
            if decoder.eof:
                finished = True
                break
            data = decoder.unconsumed_tail
    if not finished:
        try:
            out = decoder.flush()
        except zlib.error as exc:
            raise UnsupportedEncoding(f"invalid gzip body: {exc}") from exc
        if not decoder.eof:
            raise UnsupportedEncoding("truncated gzip body")
        total += len(out)
        if total > max_bytes:
            raise PushTooLarge(max_bytes)
        if out:
            yield out


def decode_request_body(
    body: AsyncIterator[bytes], content_encoding: str | None, *, max_bytes: int
) -> AsyncIterator[bytes]:
    """The request body, gunzipped if ``Content-Encoding`` says gzip, capped at ``max_bytes``."""
    encoding = (content_encoding or "").strip().lower()
    if encoding in ("", "identity"):
        return limit_stream(body, max_bytes)
    if encoding in ("gzip", "x-gzip"):
        return gunzip_stream(body, max_bytes=max_bytes)
    raise UnsupportedEncoding(f"unsupported Content-Encoding: {content_encoding!r}")
