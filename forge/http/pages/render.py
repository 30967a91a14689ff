"""Rendering for the web UI: sanitised markdown and syntax highlighting."""

import asyncio
import functools
import re

import nh3
from markdown_it import MarkdownIt
from markdown_it.rules_core import StateCore
from markdown_it.token import Token
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.util import ClassNotFound

# Raw HTML is allowed into the markdown pass and then cleaned: nh3 (ammonia) keeps a safe subset,
# drops scripts, event handlers and javascript: URLs, and marks links rel="noopener noreferrer".
_md = MarkdownIt("commonmark", {"html": True, "linkify": False}).enable("table").enable("strikethrough")
# `#N` (an issue or pull request of the repository) and `@login` become links when the caller
# names the repository; text in code spans, code blocks and links is left alone.
_REFERENCE = re.compile(r"(?<![\w&/#@])(#[1-9][0-9]{0,8}|@[A-Za-z0-9](?:[A-Za-z0-9-]{0,38}[A-Za-z0-9])?)\b")


def _link_references(state: StateCore) -> None:
    repo_url = state.env.get("repo_url") if isinstance(state.env, dict) else None
    if not repo_url:
        return
    for block in state.tokens:
        if block.type == "inline" and block.children:
            block.children = _linked(block.children, repo_url)


def _linked(children: list[Token], repo_url: str) -> list[Token]:
    out: list[Token] = []
    in_link = 0
    for tok in children:
        in_link += {"link_open": 1, "link_close": -1}.get(tok.type, 0)
        if tok.type != "text" or in_link or not _REFERENCE.search(tok.content):
            out.append(tok)
            continue
        pos = 0
        for m in _REFERENCE.finditer(tok.content):
            if m.start() > pos:
                out.append(_text(tok.content[pos : m.start()]))
            ref = m.group(1)
            href = f"{repo_url}/issues/{ref[1:]}" if ref.startswith("#") else f"/{ref[1:]}"
            opening = Token("link_open", "a", 1, attrs={"href": href, "class": "ref"})
            out += [opening, _text(ref), Token("link_close", "a", -1)]
            pos = m.end()
        if pos < len(tok.content):
            out.append(_text(tok.content[pos:]))
    return out


def _text(content: str) -> Token:
    tok = Token("text", "", 0)
    tok.content = content
    return tok


_md.core.ruler.push("forgehand_references", _link_references)
_ALLOWED_TAGS = set(nh3.ALLOWED_TAGS) | {"details", "summary", "input"}
_formatter = HtmlFormatter(linenos="table", cssclass="code", wrapcode=True)
MAX_HIGHLIGHT_BYTES = 512 * 1024


MAX_MARKDOWN_CHARS = 256 * 1024


def _local_images_only(tag: str, attr: str, value: str) -> str | None:
    # An image of another origin is a request the reader's browser makes for the author.
    if tag == "img" and attr == "src" and not (value.startswith("/") and not value.startswith("//")):
        return None
    return value


def markdown(text: str, *, remote_images: bool = True, repo_url: str = "") -> Markup:
    """Sanitised markdown. `remote_images=False` for text an agent wrote: an image address of
    another origin is dropped (its alt text stays), so opening the page sends nothing anywhere.
    With `repo_url` (`/owner/name`), `#N` links to that repository's issue or pull request N and
    `@login` to the account's page."""
    if len(text) > MAX_MARKDOWN_CHARS:
        # Rendering cost grows fast with hostile input: big documents are shown as text.
        return Markup("<pre>") + text + Markup("</pre>")
    html = _md.render(text, {"repo_url": repo_url})
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
