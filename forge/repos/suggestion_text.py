"""The suggestion a line comment carries: its first fenced block marked `suggestion`, whose lines
replace the commented line (forge/repos/pull_suggestions.py applies it)."""

import re

_BLOCK = re.compile(r"^```suggestion[ \t]*\r?\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def suggestion_of(body: str) -> list[str] | None:
    """The lines a comment suggests, or None when it suggests nothing."""
    found = _BLOCK.search(body)
    if found is None:
        return None
    return found.group(1).splitlines()
