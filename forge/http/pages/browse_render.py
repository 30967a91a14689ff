"""What the browsing pages show beyond the git layer's data: diffs highlighted line by line in a
unified or split layout, relative ages ("3 days ago"), breadcrumbs and the ref switcher's lists.

Highlighting is per line so the added/removed marks stay on their rows: each side of a hunk is
lexed as one text (so a multi-line string stays a string) and the tokens are cut at newlines.
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final, Literal
from urllib.parse import quote

from markupsafe import Markup, escape
from pygments.lexer import Lexer
from pygments.lexers import TextLexer, get_lexer_for_filename
from pygments.token import STANDARD_TYPES
from pygments.util import ClassNotFound

from forge.git.schemas import DiffLine, FileDiff

DiffView = Literal["unified", "split"]
#: Past this many diff lines on a page, lines are shown plain (escaped, not lexed).
MAX_HIGHLIGHT_LINES: Final = 20_000


# Pygments' short CSS classes (`Token.Name.Function` is `nf`), by token type: a token type is the
# tuple of its names (`("Name", "Function")`), and its ancestors are the tuple's prefixes.
_CSS_CLASSES: dict[tuple[str, ...], str] = {tuple(ttype): css for ttype, css in STANDARD_TYPES.items()}


@functools.lru_cache(maxsize=1024)
def _css_class(ttype: tuple[str, ...]) -> str:
    """The CSS class of a token type, or of its nearest ancestor that has one."""
    for end in range(len(ttype), -1, -1):
        css = _CSS_CLASSES.get(tuple(ttype[:end]))
        if css is not None:
            return css
    return ""


def _lexer(filename: str) -> Lexer:
    try:
        lexer: Lexer = get_lexer_for_filename(filename, stripnl=False, ensurenl=False)
    except ClassNotFound:
        lexer = TextLexer(stripnl=False, ensurenl=False)
    return lexer


def highlight_lines(filename: str, lines: list[str]) -> list[Markup]:
    """``lines`` as highlighted HTML, one ``Markup`` per input line (Pygments' CSS classes)."""
    if not lines:
        return []
    out: list[Markup] = []
    current: list[str] = []
    for ttype, value in _lexer(filename).get_tokens("\n".join(lines)):
        css = _css_class(ttype)
        parts = value.split("\n")
        for i, part in enumerate(parts):
            if i:
                out.append(Markup("".join(current)))  # noqa: S704 (built from escaped parts)
                current = []
            if part:
                text = str(escape(part))
                current.append(f'<span class="{css}">{text}</span>' if css else text)
    out.append(Markup("".join(current)))  # noqa: S704
    # A lexer may drop or add a trailing newline: keep exactly one row per line.
    out = out[: len(lines)]
    out.extend(escape(line) for line in lines[len(out) :])
    return out


async def highlight_lines_async(filename: str, lines: list[str]) -> list[Markup]:
    return await asyncio.to_thread(highlight_lines, filename, lines)


@dataclass
class Cell:
    lineno: int | None
    html: Markup
    kind: Literal["add", "del", "ctx", "empty"]


@dataclass
class Row:
    """One table row: a hunk header, or a line (unified: ``left`` only; split: both sides)."""

    header: str | None = None
    left: Cell | None = None
    right: Cell | None = None
    #: Unified rows keep both line numbers and the +/- mark.
    old_lineno: int | None = None
    new_lineno: int | None = None
    origin: str = " "


@dataclass
class FileView:
    file: FileDiff
    anchor: str
    rows: list[Row] = field(default_factory=list)


def _sides(lines: list[DiffLine], filename: str, plain: bool) -> dict[int, Markup]:
    """The highlighted HTML of every line of a hunk, by its index in ``lines``."""
    html: dict[int, Markup] = {}
    for wanted in (("-", " "), ("+",)):
        index = [i for i, line in enumerate(lines) if line.origin in wanted]
        texts = [lines[i].content for i in index]
        rendered = [escape(t) for t in texts] if plain else highlight_lines(filename, texts)
        html.update(zip(index, rendered, strict=True))
    return html


def _unified(lines: list[DiffLine], html: dict[int, Markup]) -> list[Row]:
    rows = []
    for i, line in enumerate(lines):
        kind: Literal["add", "del", "ctx"] = "add" if line.origin == "+" else "del" if line.origin == "-" else "ctx"
        rows.append(
            Row(
                left=Cell(None, html[i], kind),
                old_lineno=line.old_lineno,
                new_lineno=line.new_lineno,
                origin=line.origin,
            )
        )
    return rows


def _split(lines: list[DiffLine], html: dict[int, Markup]) -> list[Row]:
    """Context on both sides; a run of removals next to the run of additions that follows it."""
    rows: list[Row] = []
    empty = Cell(None, Markup(""), "empty")
    i = 0
    while i < len(lines):
        if lines[i].origin == " ":
            rows.append(
                Row(left=Cell(lines[i].old_lineno, html[i], "ctx"), right=Cell(lines[i].new_lineno, html[i], "ctx"))
            )
            i += 1
            continue
        dels: list[int] = []
        while i < len(lines) and lines[i].origin == "-":
            dels.append(i)
            i += 1
        adds: list[int] = []
        while i < len(lines) and lines[i].origin == "+":
            adds.append(i)
            i += 1
        for k in range(max(len(dels), len(adds))):
            left = Cell(lines[dels[k]].old_lineno, html[dels[k]], "del") if k < len(dels) else empty
            right = Cell(lines[adds[k]].new_lineno, html[adds[k]], "add") if k < len(adds) else empty
            rows.append(Row(left=left, right=right))
    return rows


def split_rows(lines: list[DiffLine]) -> list[Row]:
    """A hunk's lines side by side, as text (the pull request page's split view: it adds its own
    comment forms and threads to the rows)."""
    return _split(lines, {i: escape(line.content) for i, line in enumerate(lines)})


def diff_views(files: list[FileDiff], view: DiffView) -> list[FileView]:
    """The files of a diff as table rows for ``view``, highlighted unless the diff is huge."""
    total = sum(len(h.lines) for f in files for h in f.hunks)
    plain = total > MAX_HIGHLIGHT_LINES
    out: list[FileView] = []
    for number, f in enumerate(files, start=1):
        fv = FileView(file=f, anchor=f"diff-{number}")
        for hunk in f.hunks:
            fv.rows.append(Row(header=hunk.header))
            html = _sides(hunk.lines, f.path, plain)
            fv.rows.extend(_split(hunk.lines, html) if view == "split" else _unified(hunk.lines, html))
        out.append(fv)
    return out


async def diff_views_async(files: list[FileDiff], view: DiffView) -> list[FileView]:
    """`diff_views` in a worker thread: lexing a big diff must not stall the event loop."""
    return await asyncio.to_thread(diff_views, files, view)


# --- small things the templates use ----------------------------------------------------------------

_UNITS: Final = (
    (365 * 86400, "year"),
    (30 * 86400, "month"),
    (7 * 86400, "week"),
    (86400, "day"),
    (3600, "hour"),
    (60, "minute"),
)


def ago(when: datetime, now: datetime | None = None) -> str:
    """``when`` relative to ``now``: "just now", "5 minutes ago", "3 days ago", "in 2 hours"."""
    now = now or datetime.now(UTC)
    seconds = int((now - when).total_seconds())
    future = seconds < 0
    seconds = abs(seconds)
    for size, unit in _UNITS:
        if seconds >= size:
            n = seconds // size
            text = f"{n} {unit}{'s' if n != 1 else ''}"
            return f"in {text}" if future else f"{text} ago"
    return "just now"


def exact(when: datetime) -> str:
    """The exact time as people read it, with its recorded offset (the ``title`` of an age)."""
    return when.strftime("%Y-%m-%d %H:%M:%S %z")


@dataclass(frozen=True)
class Crumb:
    name: str
    path: str


def breadcrumbs(path: str) -> list[Crumb]:
    """``a/b/c`` as ``[a, a/b, a/b/c]`` with their names, for links to each folder."""
    crumbs: list[Crumb] = []
    parts = [p for p in path.strip("/").split("/") if p]
    for i, part in enumerate(parts):
        crumbs.append(Crumb(name=part, path="/".join(parts[: i + 1])))
    return crumbs


def url_path(path: str) -> str:
    """A repository path for a URL: each segment escaped, the slashes kept."""
    return quote(path, safe="/")
