"""The mention parser (forge.repos.mentions): `@login` in prose, in order, each once; never in
code spans or blocks, e-mail addresses, paths, escapes or longer words; and the cap."""

from hypothesis import given
from hypothesis import strategies as st

from forge.repos.mentions import MENTION_CAP, capped, mentioned_logins


def test_mentions_in_prose_in_order_each_once() -> None:
    assert mentioned_logins("hi @ana and @Bob, @ANA again. cc @carl-d.") == ["ana", "Bob", "carl-d"]


def test_what_is_not_a_mention() -> None:
    text = (
        "mail ana@example.com, `@span`, a path a/@b, @@x, \\@escaped, &#64;entity, @too_long_word,"
        " [link](http://x/@target)\n\n```\n@fenced\n```\n\n    @indented\n\n<div>@html</div>\n\nend @real"
    )
    assert mentioned_logins(text) == ["real"]


def test_markup_around_a_mention_keeps_it() -> None:
    assert mentioned_logins("**@bold** _@em_ (@paren) [@linktext](/x) > @quoted\n- @listed") == [
        "bold", "em", "paren", "linktext", "quoted", "listed",
    ]  # fmt: skip


def test_a_login_longer_than_the_rule_is_nobody() -> None:
    assert mentioned_logins("@" + "a" * 39) == ["a" * 39]
    assert mentioned_logins("@" + "a" * 40) == []


def test_a_mention_storm_is_capped_and_counted() -> None:
    logins = mentioned_logins(" ".join(f"@user{i}" for i in range(1000)))
    assert len(logins) == 1000
    kept, dropped = capped(logins)
    assert kept == logins[:MENTION_CAP] and dropped == 1000 - MENTION_CAP


@given(st.text(max_size=300))
def test_any_text_gives_unique_valid_logins(text: str) -> None:
    found = mentioned_logins(text)
    assert len({f.lower() for f in found}) == len(found)
    assert all(f in text for f in found)
