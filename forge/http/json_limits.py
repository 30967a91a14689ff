"""How deep JSON may nest. Decoders recurse per level (msgspec and the stdlib raise RecursionError
near Python's recursion limit), so a small body nested a thousand levels deep would reach them as a
server error. Every JSON body is measured before any decoder sees it, by the same rule webhook
answers are measured with: `webhooks.sdk.protocol.max_depth` (the consumer SDK is standard library
and PyJWT only, so forge may use it; it is the one webhooks room forge imports)."""

from typing import Any, Final

from litestar import Request

from forge.core.error_codes import Code
from forge.core.errors import ForgeError
from webhooks.sdk.protocol import max_depth

#: Deeper than any request or response shape of the API (the deepest is ~6 levels) by a wide margin.
MAX_JSON_DEPTH: Final = 128


class JsonTooDeep(ForgeError, code=Code.JSON_TOO_DEEP, title="JSON nested too deeply"):
    pass


def exceeds(data: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    # Fast path: a body with fewer opening brackets than the limit cannot nest past it (most bodies).
    if data.count(b"[") + data.count(b"{") <= limit:
        return False
    return max_depth(data) > limit


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def refuse_deep_json(request: Request[Any, Any, Any]) -> None:
    """`before_request`: a JSON body nested past `MAX_JSON_DEPTH` is a 400 before it is decoded.

    Reading the body here costs nothing extra: Litestar caches it for the handler's decoder. Git
    bodies are never JSON and are never buffered."""
    if request.method in ("GET", "HEAD", "OPTIONS") or request.route_handler.opt.get("git"):
        return
    if not _is_json(request.headers.get("content-type", "")):
        return
    if exceeds(await request.body()):
        raise JsonTooDeep(f"the JSON body nests deeper than {MAX_JSON_DEPTH} levels")
