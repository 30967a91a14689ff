"""Text hygiene at the edges. PostgreSQL cannot store NUL characters (SQLite can): a NUL that
reached a query would be a 500 on one backend and fine on the other. Inputs with NUL are refused
(or, for text that only describes a refusal, cleaned) before they get near the database; a URL
with NUL never reaches a handler (`forge.http.nul_in_url`)."""

import re

from forge.core.error_codes import Code
from forge.core.errors import InvalidInput

NUL = "\x00"


def without_nul(value: str) -> str:
    return value.replace(NUL, "\ufffd")


def safe_text(value: str) -> str:
    """`value` with what no UTF-8 encoder takes (lone surrogates: a name that is not UTF-8, as
    `os.fsdecode` gives it) written as escapes, so that it can go into JSON and the database."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


def require_no_nul(value: str, what: str) -> str:
    if NUL in value:
        raise InvalidInput(f"{what} must not contain NUL characters", code=Code.INVALID_CHARACTERS)
    return value


def code_span(text: str) -> str:
    """`text` as a markdown code span, whatever backticks it holds (a fence one longer than its
    longest run of them; padded when it starts or ends with one)."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def code_block(text: str) -> str:
    """`text` as a fenced markdown code block, its lines kept, whatever backticks it holds."""
    longest = max((len(run) for run in re.findall(r"`{3,}", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text.rstrip(chr(10))}\n{fence}"


def plural(count: int, word: str, many: str = "") -> str:
    """`1 commit`, `2 commits`, `1,024 files`: a count with its noun agreeing (`many` for a noun
    whose plural is not the word with an `s`). Also the templates' `plural` filter."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"


def one_line(text: str) -> str:
    """A title as one line: line breaks, tabs and other control characters become single spaces
    (a title goes into merge commit messages, where a line of its own would read as a trailer)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())
