"""What a pull request needs before it merges, in one place: the branch rules of its base
(`require_pull_request`, `required_approvals`, `dismiss_stale_approvals`, `required_checks`), its
reviews and its head's statuses. `unmet` lists every rule that does not hold, in words; the merge
box, the REST answer (`unmet_rules`, `branch_rule_unmet`) and the merge itself read the same list.

- An approval counts when its author has the write role now, is neither the pull request's author
  nor the last to move its head (nobody approves their own commits), has not since requested
  changes or been dismissed, and (when the rule dismisses stale approvals) approved the current head.
- A change request blocks until its author approves, or it is dismissed.
- Each required check must be `success` on the head (forge/repos/statuses.py)."""

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.core.access import Role
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput
from forge.db.models import Account, BranchRule, PullRequest, PullReview
from forge.git import RepoStore
from forge.git.compare import changed_paths
from forge.git.refrules import pattern_matches
from forge.repos import codeowners, statuses
from forge.repos.repositories import RepoResource, branch_rules, resource_roles

MAX_OWNED_PATHS = 10_000


@dataclass(frozen=True, slots=True)
class BaseRules:
    """The branch rules of one base branch, combined (the strictest of the matching rules)."""

    require_pull_request: bool = False
    required_approvals: int = 0
    dismiss_stale_approvals: bool = False
    require_code_owner_review: bool = False
    block_on_requested_changes: bool = True
    merge_allowlist: tuple[str, ...] = ()  # lower-case logins; empty: anyone with write


def combine(rules: Sequence[BranchRule], branch: str) -> BaseRules:
    ref = f"refs/heads/{branch}"
    matched = [r for r in rules if pattern_matches(r.pattern, ref)]
    return BaseRules(
        require_pull_request=any(r.require_pull_request for r in matched),
        required_approvals=max((r.required_approvals for r in matched), default=0),
        dismiss_stale_approvals=any(r.dismiss_stale_approvals for r in matched),
        require_code_owner_review=any(r.require_code_owner_review for r in matched),
        block_on_requested_changes=any(r.block_on_requested_changes for r in matched) or not matched,
        merge_allowlist=_allowed(matched),
    )


def _allowed(matched: Sequence[BranchRule]) -> tuple[str, ...]:
    """Who may merge under every matching rule that names anyone (the intersection)."""
    lists = [{login.lower() for login in r.merge_allowlist} for r in matched if r.merge_allowlist]
    if not lists:
        return ()
    common = set.intersection(*lists)
    return tuple(sorted(common)) or ("(nobody: the rules name no common account)",)


async def base_rules(session: AsyncSession, res: RepoResource, branch: str) -> BaseRules:
    return combine(await branch_rules(session, res.repo), branch)


@dataclass(frozen=True, slots=True)
class Verdicts:
    approvals: list[str]  # logins whose approval counts
    changes_requested: list[str]  # logins whose change request stands


async def verdicts(session: AsyncSession, res: RepoResource, pull: PullRequest, rules: BaseRules) -> Verdicts:
    """Each reviewer's standing verdict: their latest approval or change request not dismissed."""
    rows = (
        await session.execute(
            select(PullReview, Account)
            .join(Account, Account.id == PullReview.author_id)
            .where(
                PullReview.pull_id == pull.id,
                PullReview.dismissed.is_(False),
                PullReview.verdict.in_(("approve", "request_changes")),
            )
            .order_by(PullReview.id.desc())
        )
    ).all()
    latest: dict[int, tuple[PullReview, Account]] = {}
    for review, account in rows:
        latest.setdefault(account.id, (review, account))
    roles = await resource_roles(session, res, list(latest))
    approvals: list[str] = []
    changes: list[str] = []
    for account_id, (review, account) in latest.items():
        role = roles.get(account_id)
        if role is None or role < Role.WRITE:
            continue  # a reviewer who lost write access neither counts nor blocks
        if review.verdict == "request_changes":
            changes.append(account.login)
            continue
        stale = rules.dismiss_stale_approvals and review.commit_sha != pull.head_sha
        if account_id not in (pull.author_id, pull.head_pushed_by_id) and not stale:
            approvals.append(account.login)
    return Verdicts(approvals=sorted(approvals), changes_requested=sorted(changes))


async def unmet(
    session: AsyncSession, res: RepoResource, pull: PullRequest, store: RepoStore
) -> tuple[list[str], Verdicts]:
    """Every rule the pull request does not meet yet, in words (empty: it may merge), and the
    verdicts that counted."""
    rules = await base_rules(session, res, pull.base_ref)
    found = await verdicts(session, res, pull, rules)
    unmet_rules: list[str] = []
    if pull.draft:
        unmet_rules.append("the pull request is a draft: mark it ready for review first")
    if not pull.head_sha:
        unmet_rules.append(f"the head branch {pull.head_ref} was deleted")
    if len(found.approvals) < rules.required_approvals:
        unmet_rules.append(
            f"{rules.required_approvals} approval(s) required by the rules of {pull.base_ref}, "
            f"{len(found.approvals)} given"
        )
    if rules.block_on_requested_changes:
        unmet_rules.extend(f"changes requested by {login}" for login in found.changes_requested)
    if rules.require_code_owner_review and pull.head_sha:
        unmet_rules.extend(await code_owners_unmet(session, res, store, pull.base_ref, pull.head_sha, found.approvals))
    if pull.head_sha:
        _, unmet_checks = await statuses.head_checks(session, res.repo, pull.base_ref, pull.head_sha)
        unmet_rules.extend(unmet_checks)
    return unmet_rules, found


async def code_owners_unmet(
    session: AsyncSession, res: RepoResource, store: RepoStore, base: str, head_sha: str, approvals: list[str]
) -> list[str]:
    """Each group of changed paths whose owners (the base's CODEOWNERS) have not approved; a
    CODEOWNERS that cannot be read as rules, or none at all, fails closed, each problem named."""
    owners = await store.read(res.key, codeowners.read, base)
    if not owners.path:
        return [f"code owners must approve, but {base} has no CODEOWNERS ({', '.join(codeowners.LOCATIONS)}): add one"]
    problems = [f"{p} (in {owners.path} on {base}: fix it there)" for p in owners.errors]
    named = sorted({login for rule in owners.rules for login in rule.owners})
    known: set[str] = set()
    for start in range(0, len(named), 500):  # bounded IN lists
        chunk = named[start : start + 500]
        known |= set((await session.execute(select(Account.login_key).where(Account.login_key.in_(chunk)))).scalars())
    problems += [
        f"CODEOWNERS line {rule.line}: @{login} is not an account (in {owners.path} on {base}: fix it there)"
        for rule in owners.rules
        for login in rule.owners
        if login not in known
    ][:10]
    if problems:
        return problems
    changed = await store.read(res.key, changed_paths, base, head_sha)
    if len(changed) > MAX_OWNED_PATHS:
        return [f"the change touches {len(changed)} paths, more than code owners are checked for ({MAX_OWNED_PATHS})"]
    approved = {login.lower() for login in approvals}
    waiting: dict[tuple[str, ...], list[str]] = {}
    for path in changed:
        path_owners = owners.owners_of(path)
        if path_owners and not approved & set(path_owners):
            waiting.setdefault(path_owners, []).append(path)
    return [
        f"a code owner ({', '.join('@' + o for o in group)}) must approve "
        + ", ".join(paths[:5])
        + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        for group, paths in waiting.items()
    ]


async def head_writable(session: AsyncSession, res: RepoResource, branch: str) -> None:
    """forgehand writing to a pull request's head (Update branch, a suggestion) is refused where a
    person's push would be: `agent/*` (tasks write those) and branches that take pull requests only."""
    if branch.casefold().startswith("agent/"):
        raise InvalidInput(
            f"{branch} is written by its task only: request changes so the agent does it", code=Code.PULL_REQUIRED
        )
    if (await base_rules(session, res, branch)).require_pull_request:
        raise InvalidInput(
            f"{branch} takes changes through pull requests only: change it through a pull request of its own",
            code=Code.PULL_REQUIRED,
        )


def may_merge(rules: BaseRules, login: str) -> bool:
    """Whether the branch's merge allow-list (if any) names this login."""
    return not rules.merge_allowlist or login.lower() in rules.merge_allowlist
