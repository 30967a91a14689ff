"""Line-by-line highlighting, the split layout's pairing, ages and breadcrumbs."""

import html
import re
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from forge.git.schemas import DiffLine, FileDiff, Hunk
from forge.http.pages.browse_render import ago, breadcrumbs, diff_views, highlight_lines, url_path

_TAG = re.compile(r"<[^>]+>")


def _text(markup: str) -> str:
    return html.unescape(_TAG.sub("", markup))


# Any text without line breaks (what a diff line or a split line is).
LINE = st.text(
    alphabet=st.characters(
        blacklist_categories=["Cs"], blacklist_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
    ),
    max_size=40,
)


@given(st.lists(LINE, max_size=20))
def test_highlighting_keeps_every_line_and_its_text(lines: list[str]) -> None:
    for name in ("x.py", "x.js", "x.unknown-language"):
        out = highlight_lines(name, lines)
        assert len(out) == len(lines)
        assert [_text(str(m)) for m in out] == lines


def test_a_multiline_string_stays_a_string_on_each_line() -> None:
    out = highlight_lines("x.py", ['s = """one', "two <b>", 'three"""', "x = 1"])
    assert '<span class="s2">two &lt;b&gt;</span>' in out[1]
    assert '<span class="k">' not in out[1]
    assert out[3].startswith('<span class="n">x</span>')


def _line(origin: str, old: int | None, new: int | None, text: str) -> DiffLine:
    return DiffLine(origin=origin, old_lineno=old, new_lineno=new, content=text)  # type: ignore[arg-type]


def _file(lines: list[DiffLine]) -> FileDiff:
    hunk = Hunk(header="@@ -1,3 +1,4 @@", old_start=1, old_lines=3, new_start=1, new_lines=4, lines=lines)
    return FileDiff(
        path="a.py", old_path="a.py", status="modified", old_sha=None, new_sha=None, old_mode=None,
        new_mode=None, additions=2, deletions=1, is_binary=False, too_large=False, hunks=[hunk],
    )  # fmt: skip


def test_split_pairs_removals_with_the_additions_after_them() -> None:
    f = _file([
        _line(" ", 1, 1, "a = 1"),
        _line("-", 2, None, "b = 2"),
        _line("+", None, 2, "b = 3"),
        _line("+", None, 3, "c = 4"),
        _line(" ", 3, 4, "d = 5"),
    ])  # fmt: skip
    (view,) = diff_views([f], "split")
    header, *rows = view.rows
    assert header.header == "@@ -1,3 +1,4 @@" and view.anchor == "diff-1"
    cells = [(r.left.kind, r.left.lineno, r.right.kind, r.right.lineno) for r in rows if r.left and r.right]
    assert cells == [
        ("ctx", 1, "ctx", 1),
        ("del", 2, "add", 2),
        ("empty", None, "add", 3),
        ("ctx", 3, "ctx", 4),
    ]
    assert _text(str(rows[1].left.html)) == "b = 2" and _text(str(rows[1].right.html)) == "b = 3"  # type: ignore[union-attr]
    (unified,) = diff_views([f], "unified")
    assert [(r.origin, r.old_lineno, r.new_lineno) for r in unified.rows[1:]] == [
        (" ", 1, 1), ("-", 2, None), ("+", None, 2), ("+", None, 3), (" ", 3, 4),
    ]  # fmt: skip


def test_ages() -> None:
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert ago(now - timedelta(seconds=30), now) == "just now"
    assert ago(now - timedelta(minutes=1), now) == "1 minute ago"
    assert ago(now - timedelta(days=3, hours=2), now) == "3 days ago"
    assert ago(now - timedelta(days=800), now) == "2 years ago"
    assert ago(now + timedelta(hours=2), now) == "in 2 hours"


def test_breadcrumbs_and_url_paths() -> None:
    assert [(c.name, c.path) for c in breadcrumbs("/src/lib/x.py")] == [
        ("src", "src"), ("lib", "src/lib"), ("x.py", "src/lib/x.py"),
    ]  # fmt: skip
    assert breadcrumbs("") == []
    assert url_path("a b/c#d?.py") == "a%20b/c%23d%3F.py"
