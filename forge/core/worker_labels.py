"""Worker labels: what a worker offers (`forgehand worker --labels gpu,large`,
FORGEHAND_WORKER_LABELS) and what a task requires of the worker that claims its runs (the
repository's task settings and the task's start). One rule for both: a label is lowercase letters,
digits, `_`, `.` and `-`, starts with a letter or digit, is at most 32 characters; at most 8."""

import re
from collections.abc import Iterable

LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,31}$")
MAX_LABELS = 8
RULE = "a label is 1-32 of a-z, 0-9, `_`, `.`, `-` starting with a letter or digit (e.g. gpu), at most 8"


def checked_labels(labels: Iterable[str]) -> list[str]:
    """The labels, deduplicated and sorted; ValueError naming the first bad one (and the rule)."""
    found: set[str] = set()
    for label in labels:
        if not LABEL_RE.fullmatch(label):
            raise ValueError(f"{label!r} is not a worker label: {RULE}")
        found.add(label)
    if len(found) > MAX_LABELS:
        raise ValueError(f"{len(found)} worker labels: {RULE}")
    return sorted(found)


def parse_labels(text: str) -> list[str]:
    """A comma-separated list of labels (spaces around them ignored; "" for none)."""
    return checked_labels(part.strip() for part in text.split(",") if part.strip())
