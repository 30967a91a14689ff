"""What every task page shows about its repository, how a page shows JSON to a person, and the
pages' dependencies (a reader who sees the repository but not its tasks is told why)."""

import json
import unicodedata
from typing import Any

import msgspec

from forge.core.access import Principal
from forge.http.pages.common import or_form_error as or_form_error
from forge.repos import repositories
from forge.repos.repositories import RepoResource
from tasks.core.schemas import TaskRead
from tasks.http.deps import DEPENDENCIES
from tasks.services import rules


def repo_context(res: RepoResource, principal: Principal, base_url: str) -> dict[str, Any]:
    return {
        "repo": repositories.to_read(res, principal, base_url),
        "can_admin": rules.may_configure(principal, res),
        "can_write": rules.may_act(principal, res),
    }


def visible_json(value: Any) -> str:
    """JSON for a person to approve: readable (non-ASCII text as is), but characters that are
    invisible or change the text's direction are shown escaped, so they cannot disguise a command."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    hidden = ("Cc", "Cf", "Co", "Cs", "Zl", "Zp")
    return "".join(f"\\u{ord(ch):04x}" if ch != "\n" and unicodedata.category(ch) in hidden else ch for ch in text)


class Tokens(msgspec.Struct, kw_only=True):
    prompt: int
    completion: int
    turns: int


def run_tokens(read: TaskRead) -> Tokens:
    """The model tokens the task's runs used so far (the runs' own counters)."""
    return Tokens(
        prompt=sum(r.prompt_tokens for r in read.runs),
        completion=sum(r.completion_tokens for r in read.runs),
        turns=sum(r.turns for r in read.runs),
    )


def usage_line(read: TaskRead) -> str:
    """The task's model use so far, as the header says it: the gateway's metering (tokens, cache,
    cost when priced), else the runtime's own counters, else that no model was called ("yet"
    while the task may still call one). Empty for a command task: it never calls a model."""
    u = read.usage
    if u.input_tokens or u.output_tokens or u.cache_read_tokens or u.cache_write_tokens:
        text = f"{u.input_tokens:,} input + {u.output_tokens:,} output tokens"
        if u.cache_read_tokens or u.cache_write_tokens:
            text += f" (cache: {u.cache_read_tokens:,} read, {u.cache_write_tokens:,} written)"
        return text + (f" · ${u.cost_usd:,.4f}" if u.cost_usd is not None else " · cost not known")
    tokens = run_tokens(read)
    if tokens.prompt or tokens.completion:
        turns = f" in {tokens.turns} model turns" if tokens.turns else ""
        return f"{tokens.prompt:,} prompt + {tokens.completion:,} completion tokens{turns} · cost not known"
    if read.runtime == "command":
        return ""
    return "no model calls yet" if read.state in ("queued", "running", "blocked") else "no model calls"


def egress_line(read: TaskRead) -> str:
    """What the egress proxy did for the task's runs (docs/egress.md); empty when it did nothing."""
    e = read.egress
    if not e.allowed and not e.blocked:
        return ""
    made = f"{e.allowed:,} connection{'s' if e.allowed != 1 else ''} through the egress proxy"
    return f"{made} · {e.blocked:,} refused" if e.blocked else made


# Pages load the repository as the REST API does: below the write role tasks are 404 on both
# (forge.core.access.require), whatever the caller can read of the repository.
PAGE_DEPENDENCIES = DEPENDENCIES
