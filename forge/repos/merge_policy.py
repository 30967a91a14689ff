"""The `pre_merge` policy question for pull requests, as forge asks it: every merge of a pull
request, a person's or an agent's, is put to the repository's policy consumers before anything
moves (docs/webhooks.md, `pre_merge`). forge knows the question, not who answers it: the
composition root (forge/app) hands in the webhooks dispatcher's implementation; without one,
every merge is allowed (no consumer can be configured then)."""

from typing import Any, Protocol

import msgspec

from forge.db.events import AccountRef


class MergeVerdict(msgspec.Struct, frozen=True, kw_only=True):
    allowed: bool = True
    reason: str = ""
    # A consumer could not be asked and its failure policy refuses (fail-closed): 502, not 403.
    failed: bool = False


class MergePolicy(Protocol):
    async def pre_merge(
        self, *, repo_id: int, repo_uuid: str, full_name: str, actor: AccountRef | None, merge: dict[str, Any]
    ) -> MergeVerdict: ...


class AllowAll:
    """No policy consumers wired (a bare forge): every merge is allowed."""

    async def pre_merge(
        self, *, repo_id: int, repo_uuid: str, full_name: str, actor: AccountRef | None, merge: dict[str, Any]
    ) -> MergeVerdict:
        return MergeVerdict()
