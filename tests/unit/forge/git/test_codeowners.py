"""CODEOWNERS read as GitHub reads it: gitignore's patterns, the last matching line wins, a line
without owners unowns; what it cannot read is named by line."""

import pytest

from forge.repos.codeowners import parse

FILE = """\
# the whole repository
*                 @ana
*.py              @bob @Carl   # trailing comment
/docs/            @dora
src/**/test_*.py  @tess
apps/             @ana @bob
/vendor/
"""


@pytest.mark.parametrize(
    ("path", "owners"),
    [
        ("README.md", ("ana",)),
        ("a/b.py", ("bob", "carl")),
        ("docs/guide.md", ("dora",)),
        ("docs/deep/x.py", ("dora",)),  # /docs/ comes after *.py: the later line wins
        ("sub/docs/guide.md", ("ana",)),  # /docs/ is anchored at the root
        ("src/a/b/test_x.py", ("tess",)),
        ("web/apps/index.js", ("ana", "bob")),  # apps/ matches at any depth
        ("vendor/lib.c", ()),  # a pattern without owners: nobody owns it
    ],
)
def test_the_last_matching_line_names_the_owners(path: str, owners: tuple[str, ...]) -> None:
    assert parse(FILE).owners_of(path) == owners


def test_what_cannot_be_read_is_named_by_line() -> None:
    found = parse("*.md @ana\n!secret.md @bob\nlib/ @org/team\nsrc/ me@example.org\nx/ bob\n")
    assert found.errors == [
        "CODEOWNERS line 2: negation (!secret.md) is not supported",
        "CODEOWNERS line 3: team owners (@org/team) are not supported: name people as @login",
        "CODEOWNERS line 4: e-mail owners (me@example.org) are not supported: name the account as @login",
        "CODEOWNERS line 5: owner 'bob' is not written @login",
    ]
    assert parse("").rules == [] and parse("# only comments\n\n").errors == []


def test_a_file_with_too_many_rules_is_named_not_matched_without_end() -> None:
    found = parse("".join(f"dir{i}/ @ana\n" for i in range(2100)))
    assert len(found.rules) == 2000
    assert found.errors == ["CODEOWNERS line 2001: more than 2000 rules: merge patterns"]
