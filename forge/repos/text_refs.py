"""What a text refers to, read without any database: `#N` references, `Fixes #N` closing
references and task branch names, all outside code spans and code blocks (forge.repos.issue_refs and
forge.repos.issue_agents use them; `@login` mentions are forge.repos.mentions)."""

import re

from forge.repos.mentions import prose

MAX_REFERENCES = 50  # references one text makes, at most (more are ignored)
_REF = re.compile(r"(?<![\w&/#\\])#([1-9][0-9]{0,8})\b")  # `\#7` (escaped) is no reference
_CLOSING = re.compile(
    r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\b:?\s+#([1-9][0-9]{0,8})\b",
    re.IGNORECASE,
)


def defuse_closing(text: str) -> str:
    """`text` with its closing keywords made inert (`Fixes \\#7`: markdown still shows `Fixes #7`):
    for text an agent wrote, which must not close issues when it merges."""
    return _CLOSING_ANYWHERE.sub(lambda m: m.group(0)[: -len(m.group(1)) - 1] + "\\#" + m.group(1), text)


def _prose(text: str) -> str:
    # As markdown reads it: code spans and blocks, HTML and link targets left out (the same
    # reading as `@login` mentions).
    return prose(text)


_CLOSING_ANYWHERE = re.compile(
    r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\b:?\s+#([1-9][0-9]{0,8})\b",
    re.IGNORECASE,
)


def references(text: str) -> list[int]:
    """The issue numbers `#N` in the text, in order, each once, outside code."""
    found = dict.fromkeys(int(m.group(1)) for m in _REF.finditer(_prose(text)))
    return list(found)[:MAX_REFERENCES]


def closing_references(text: str) -> list[int]:
    """The issue numbers a `Fixes #N` (and its kin) in the text closes, each once, outside code."""
    found = dict.fromkeys(int(m.group(1)) for m in _CLOSING.finditer(_prose(text)))
    return list(found)[:MAX_REFERENCES]


_TASK_BRANCH = re.compile(r"agent/(\d{1,9})-", re.IGNORECASE)


def task_number_of(head_ref: str) -> int | None:
    """The task whose branch a pull request's head is (`agent/<number>-<slug>`), or None."""
    found = _TASK_BRANCH.match(head_ref)
    return int(found.group(1)) if found else None
