"""What a text refers to, read without any database: `#N` references, `Fixes #N` closing
references and `@login` mentions, all outside code spans and code blocks (forge.repos.issue_refs,
forge.repos.issue_agents and the notifications use them)."""

import re

MAX_REFERENCES = 50  # references one text makes, at most (more are ignored)
_FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(`+)[^`]*?\1")
_REF = re.compile(r"(?<![\w&/#])#([1-9][0-9]{0,8})\b")
_CLOSING = re.compile(
    r"\b(?:close[sd]?|fix(?:e[sd])?|resolve[sd]?)\b:?\s+#([1-9][0-9]{0,8})\b",
    re.IGNORECASE,
)


def _prose(text: str) -> str:
    return _INLINE.sub(" ", _FENCED.sub(" ", text))


_MENTION = re.compile(r"(?<![\w@./+-])@([A-Za-z0-9](?:[A-Za-z0-9-]{0,38}[A-Za-z0-9])?)\b(?![@.]\w)")
MAX_MENTIONS = 50  # logins one text mentions, at most (more are ignored)


def mentions(text: str) -> list[str]:
    """The logins `@login` in the text, in order, each once (in any case), outside code and not in
    e-mail addresses."""
    found: dict[str, str] = {}
    for m in _MENTION.finditer(_prose(text)):
        found.setdefault(m.group(1).lower(), m.group(1))
    return list(found.values())[:MAX_MENTIONS]


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
