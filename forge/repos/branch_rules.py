"""Branch protection rules, the rows: list, add or change, remove. The push rules of the git
layer (`forge.git.refrules`) apply them to each ref update of a push."""

import msgspec
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account, BranchRule, Repository
from forge.git.refrules import pattern_matches
from forge.repos.repositories import RepoResource, branch_rules

MAX_REQUIRED_CHECKS = 20
MAX_REQUIRED_APPROVALS = 10
MAX_MERGERS = 50


class BranchRuleRead(msgspec.Struct, kw_only=True):
    id: int
    pattern: str
    allow_force_push: bool
    allow_deletion: bool
    # Status contexts that must be `success` on a head before it merges into a matching branch.
    required_checks: list[str]
    # Direct pushes refused: changes arrive through pull requests (docs/pulls.md).
    require_pull_request: bool
    # Approvals a pull request into a matching branch needs from people with write access.
    required_approvals: int
    # A push to a pull request's head dismisses the approvals of older heads.
    dismiss_stale_approvals: bool
    # Each changed path that CODEOWNERS gives owners needs one of them to approve.
    require_code_owner_review: bool
    # A standing change request blocks the merge.
    block_on_requested_changes: bool
    # Who may merge pull requests into a matching branch (empty: anyone with the write role).
    merge_allowlist: list[str]


class PullRules(msgspec.Struct, frozen=True, kw_only=True):
    """What a rule asks of pull requests into a matching branch (forge/repos/merge_rules.py)."""

    require_pull_request: bool = False
    required_approvals: int = 0
    dismiss_stale_approvals: bool = True
    require_code_owner_review: bool = False
    block_on_requested_changes: bool = True
    merge_allowlist: list[str] = []


def _read(rule: BranchRule) -> BranchRuleRead:
    return BranchRuleRead(
        id=rule.id,
        pattern=rule.pattern,
        allow_force_push=rule.allow_force_push,
        allow_deletion=rule.allow_deletion,
        required_checks=list(rule.required_checks or []),
        require_pull_request=rule.require_pull_request,
        required_approvals=rule.required_approvals,
        dismiss_stale_approvals=rule.dismiss_stale_approvals,
        require_code_owner_review=rule.require_code_owner_review,
        block_on_requested_changes=rule.block_on_requested_changes,
        merge_allowlist=list(rule.merge_allowlist or []),
    )


def _approvals(count: int) -> int:
    if not 0 <= count <= MAX_REQUIRED_APPROVALS:
        raise InvalidInput(
            f"required approvals is a count from 0 to {MAX_REQUIRED_APPROVALS}, not {count}",
            code=Code.INVALID_REQUIRED_APPROVALS,
        )
    return count


def _checks(given: list[str]) -> list[str]:
    checks = sorted({c.strip() for c in given})
    if len(checks) > MAX_REQUIRED_CHECKS or any(not c or len(c) > 255 or not c.isprintable() for c in checks):
        raise InvalidInput(
            f"required checks are at most {MAX_REQUIRED_CHECKS} status contexts of 1-255 printable characters, "
            "e.g. ci/build",
            code=Code.INVALID_REQUIRED_CHECKS,
        )
    return checks


async def _mergers(session: AsyncSession, given: list[str]) -> list[str]:
    """The logins of a merge allow-list, as the accounts spell them; an unknown one is refused."""
    keys = sorted({g.strip().removeprefix("@").lower() for g in given if g.strip()})
    if len(keys) > MAX_MERGERS:
        raise InvalidInput(f"a merge allow-list names at most {MAX_MERGERS} accounts", code=Code.INVALID_MERGERS)
    found = {
        a.login_key: a.login
        for a in (await session.execute(select(Account).where(Account.login_key.in_(keys)))).scalars()
    }
    missing = [k for k in keys if k not in found]
    if missing:
        raise InvalidInput(
            f"no account {', '.join(missing)}: a merge allow-list names people or bots by login",
            code=Code.INVALID_MERGERS,
        )
    return [found[k] for k in keys]


async def required_checks(session: AsyncSession, repo: Repository, branch: str) -> list[str]:
    """The status contexts every matching rule of `branch` requires, sorted (none: empty)."""
    ref = f"refs/heads/{branch}"
    found = {
        check
        for rule in await branch_rules(session, repo)
        if pattern_matches(rule.pattern, ref)
        for check in rule.required_checks or []
    }
    return sorted(found)


async def list_rules(session: AsyncSession, res: RepoResource) -> list[BranchRuleRead]:
    return [_read(r) for r in await branch_rules(session, res.repo)]


async def add_branch_rule(
    session: AsyncSession,
    actor: Actor,
    res: RepoResource,
    pattern: str,
    *,
    allow_force_push: bool,
    allow_deletion: bool,
    required: list[str] | None = None,
    pulls: PullRules | None = None,
) -> BranchRuleRead:
    require(actor.principal, Action.REPO_ADMIN, res)
    checks = _checks(required or [])
    pulls = pulls or PullRules()
    approvals = _approvals(pulls.required_approvals)
    allowed = await _mergers(session, pulls.merge_allowlist)
    pattern = pattern.strip()
    if not pattern or len(pattern) > 255 or any(c in pattern for c in "\x00\n\r "):
        raise InvalidInput("a pattern is 1-255 characters without spaces", code=Code.INVALID_PATTERN)
    existing = (
        await session.execute(
            select(BranchRule).where(BranchRule.repo_id == res.repo.id, BranchRule.pattern == pattern)
        )
    ).scalar_one_or_none()
    if existing is None:
        existing = BranchRule(repo_id=res.repo.id, pattern=pattern)
        session.add(existing)
    existing.allow_force_push = allow_force_push
    existing.allow_deletion = allow_deletion
    existing.required_checks = checks or None
    existing.require_pull_request = pulls.require_pull_request
    existing.required_approvals = approvals
    existing.dismiss_stale_approvals = pulls.dismiss_stale_approvals
    existing.require_code_owner_review = pulls.require_code_owner_review
    existing.block_on_requested_changes = pulls.block_on_requested_changes
    existing.merge_allowlist = allowed or None
    await session.flush()
    audit.record(
        session,
        actor,
        "repo.branch_rule.set",
        res.full_name,
        pattern=pattern,
        allow_force_push=allow_force_push,
        allow_deletion=allow_deletion,
        required_checks=checks,
        require_pull_request=pulls.require_pull_request,
        required_approvals=approvals,
        dismiss_stale_approvals=pulls.dismiss_stale_approvals,
        require_code_owner_review=pulls.require_code_owner_review,
        block_on_requested_changes=pulls.block_on_requested_changes,
        merge_allowlist=allowed,
    )
    return _read(existing)


async def remove_branch_rule(session: AsyncSession, actor: Actor, res: RepoResource, rule_id: int) -> None:
    require(actor.principal, Action.REPO_ADMIN, res)
    rule = await session.get(BranchRule, rule_id)
    if rule is None or rule.repo_id != res.repo.id:
        raise NotFound("no such branch rule", code=Code.BRANCH_RULE_NOT_FOUND)
    audit.record(session, actor, "repo.branch_rule.remove", res.full_name, pattern=rule.pattern)
    await session.delete(rule)
