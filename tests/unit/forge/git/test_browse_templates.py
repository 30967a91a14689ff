"""The tree partial when the capped walk did not reach every entry: those show "…" and a note
says how far the walk went."""

from datetime import UTC, datetime
from pathlib import Path

from jinja2 import Environment, FileSystemLoader

import forge
from forge.git.history import LastCommits
from forge.git.schemas import CommitInfo, Signature, TreeEntry, TreeListing
from forge.http.pages.browse_render import ago, exact, url_path

TEMPLATES = Path(forge.__file__).parent / "templates"


def test_entries_past_the_walk_cap_show_an_ellipsis_and_a_note() -> None:
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True)
    when = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    sig = Signature(name="Ana", email="ana@example.org", time=when)
    commit = CommitInfo(
        sha="a" * 40, short_sha="a" * 7, parents=[], author=sig, committer=sig, summary="Touch <new>", message=""
    )
    listing = TreeListing(
        commit_sha="a" * 40,
        path="",
        sha="b" * 40,
        entries=[
            TreeEntry(name="new.txt", path="new.txt", type="blob", mode="100644", sha="c" * 40, size=3),
            TreeEntry(name="LICENSE", path="LICENSE", type="blob", mode="100644", sha="d" * 40, size=3),
        ],
    )
    last = LastCommits(commits={"new.txt": commit}, walked=5000, complete=False)
    html = env.get_template("repos/_tree.html").render(
        tree=listing, last=last, ref=None, repo={"full_name": "ana/proj"}, ago=ago, exact=exact, url_path=url_path
    )
    new_row = html[html.index("new.txt</a>") :].split("</tr>")[0]
    assert "Touch &lt;new&gt;" in new_row and 'datetime="2026-11-28T12:00:00+00:00"' in new_row
    license_row = html[html.index("LICENSE</a>") :].split("</tr>")[0]
    assert 'title="older than the 5000 newest commits">…</span>' in license_row
    assert "looked up in the 5000 newest commits" in html
