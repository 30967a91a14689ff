"""`@login` mentions in markdown text: pure, text in, the logins out (in order of first mention,
each once, case kept as first written; compare them case-insensitively).

What counts, as on GitHub: `@` then a login (letters and digits, single hyphens inside, at most
39 characters), not preceded by a word character, `@`, `/`, `.` or a backslash (so e-mail
addresses `ana@example.com`, paths, `@@x` and `\\@x` are not mentions), not inside a code span, a
fenced or indented code block, HTML or a link's target, and not followed by `@`, `_`, `-` or a
letter or digit (a login longer than the rule is nobody).

The notifier uses it (forge.notify.recipients) with a cap, `MENTION_CAP`; the agents a comment
asks to work (forge.repos.issue_agents) are found by the same parser, so a mention that notifies
a bot is the mention that starts it."""

import re

from markdown_it import MarkdownIt

# A mention notifies at most this many accounts per text; the rest are dropped, logged and audited
# (docs/notifications.md, "Mentions").
MENTION_CAP = 50

# forge.accounts.accounts' login rule: letters and digits, single hyphens inside, at most 39.
_LOGIN = r"[A-Za-z0-9](?:[A-Za-z0-9]|-(?=[A-Za-z0-9])){0,38}"
_MENTION = re.compile(r"(?<![A-Za-z0-9_@/`.+\\\\&#;-])@(" + _LOGIN + r")(?![A-Za-z0-9_@-])")


# text_join off: escapes and entities stay tokens of their own (`\\@ana` mentions nobody).
_MD = MarkdownIt("commonmark").disable("text_join")
_BREAKS = {"softbreak", "hardbreak"}


def prose(text: str) -> str:
    """The text of `text`'s paragraphs, headings, lists and quotes as markdown reads it: code
    spans and blocks, HTML and link targets left out (each as a space, so nothing joins across)."""
    out: list[str] = []
    for block in _MD.parse(text):
        if block.type != "inline":
            continue  # fences, indented code and HTML blocks have no inline children
        for token in block.children or ():
            if token.type == "text":
                out.append(token.content)
            elif token.type == "text_special":
                out.append(token.markup)  # as written: `\\@` or `&#64;`, never a bare `@`
            else:
                out.append("\n" if token.type in _BREAKS else " ")
        out.append("\n")
    return "".join(out)


def mentioned_logins(text: str) -> list[str]:
    """The logins `text` mentions, in order, each once (case-insensitively)."""
    seen: set[str] = set()
    found: list[str] = []
    for match in _MENTION.finditer(prose(text)):
        login = match.group(1)
        key = login.lower()
        if login and key not in seen:
            seen.add(key)
            found.append(login)
    return found


def capped(logins: list[str], cap: int = MENTION_CAP) -> tuple[list[str], int]:
    """The first `cap` logins and how many were dropped past it."""
    return logins[:cap], max(0, len(logins) - cap)
