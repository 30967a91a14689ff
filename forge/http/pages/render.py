"""Rendering for the web UI: sanitised markdown and syntax highlighting."""

import asyncio
import functools

import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

# Raw HTML is allowed into the markdown pass and then cleaned: nh3 (ammonia) keeps a safe subset,
# drops scripts, event handlers and javascript: URLs, and marks links rel="noopener noreferrer".
_md = MarkdownIt("commonmark", {"html": True, "linkify": False}).enable("table").enable("strikethrough")
_ALLOWED_TAGS = set(nh3.ALLOWED_TAGS) | {"details", "summary", "input"}
_formatter = HtmlFormatter(linenos="table", cssclass="code", wrapcode=True)
MAX_HIGHLIGHT_BYTES = 512 * 1024


MAX_MARKDOWN_CHARS = 256 * 1024


def _local_images_only(tag: str, attr: str, value: str) -> str | None:
    # An image of another origin is a request the reader's browser makes for the author.
    if tag == "img" and attr == "src" and not (value.startswith("/") and not value.startswith("//")):
        return None
    return value


def markdown(text: str, *, remote_images: bool = True) -> Markup:
    """Sanitised markdown. `remote_images=False` for text an agent wrote: an image address of
    another origin is dropped (its alt text stays), so opening the page sends nothing anywhere."""
    if len(text) > MAX_MARKDOWN_CHARS:
        # Rendering cost grows fast with hostile input: big documents are shown as text.
        return Markup("<pre>") + text + Markup("</pre>")
    html = _md.render(text)
    attribute_filter = None if remote_images else _local_images_only
    return Markup(  # noqa: S704
        nh3.clean(html, tags=_ALLOWED_TAGS, link_rel="noopener noreferrer nofollow", attribute_filter=attribute_filter)
    )


@functools.lru_cache(maxsize=256)
def _lexer_name(filename: str) -> str | None:
    try:
        return str(get_lexer_for_filename(filename).name)
    except ClassNotFound:
        return None


def highlight_code(filename: str, text: str) -> Markup:
    """Highlighted source with line numbers; plain text when the language is unknown or the file is big."""
    lexer = TextLexer()
    if len(text) <= MAX_HIGHLIGHT_BYTES:
        try:
            lexer = get_lexer_for_filename(filename, stripnl=False)
        except ClassNotFound:
            lexer = TextLexer()
    return Markup(highlight(text, lexer, _formatter))  # noqa: S704 (pygments escapes its input)


async def markdown_async(text: str) -> Markup:
    """`markdown` in a worker thread: rendering a big document must not stall the event loop."""
    return await asyncio.to_thread(markdown, text)


async def highlight_async(filename: str, text: str) -> Markup:
    return await asyncio.to_thread(highlight_code, filename, text)
