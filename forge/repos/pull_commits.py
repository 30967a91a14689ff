"""A pull request's commits in GitHub's shape (`GET .../pulls/{number}/commits`): those of its head
that its base lacks, oldest first, at most the newest 250 (GitHub's cap). A merged or closed pull
request is read against the base it had (its `base.sha`), so its commits stay listed after the
merge; one whose head branch is gone lists none (docs/pulls.md)."""

from datetime import UTC, datetime

import msgspec

from forge.db.models import PullRequest
from forge.git.compare import commits_ahead
from forge.git.schemas import CommitInfo, Signature
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource


class CommitPerson(msgspec.Struct, frozen=True, kw_only=True):
    """The author or committer as git recorded them (`date` in UTC)."""

    name: str
    email: str
    date: datetime


class CommitParent(msgspec.Struct, frozen=True, kw_only=True):
    sha: str
    url: str
    html_url: str


class CommitBody(msgspec.Struct, frozen=True, kw_only=True):
    message: str
    author: CommitPerson
    committer: CommitPerson


class PullCommitRead(msgspec.Struct, frozen=True, kw_only=True):
    """One commit of a pull request (GitHub's shape, without its account and verification fields)."""

    sha: str
    commit: CommitBody
    url: str
    html_url: str
    parents: list[CommitParent]


def _person(sig: Signature) -> CommitPerson:
    return CommitPerson(name=sig.name, email=sig.email, date=sig.time.astimezone(UTC))


def commit_read(c: CommitInfo, api: str, html: str) -> PullCommitRead:
    """`c` as GitHub lists it; `api` and `html` are the repository's API and page addresses."""
    return PullCommitRead(
        sha=c.sha,
        commit=CommitBody(message=c.message, author=_person(c.author), committer=_person(c.committer)),
        url=f"{api}/commits/{c.sha}",
        html_url=f"{html}/commit/{c.sha}",
        parents=[CommitParent(sha=p, url=f"{api}/commits/{p}", html_url=f"{html}/commit/{p}") for p in c.parents],
    )


async def commits_of(pulls: Pulls, res: RepoResource, pull: PullRequest) -> list[CommitInfo]:
    """What the pull request proposes, oldest first (the page's Commits tab lists the same)."""
    if not pull.head_sha:  # the head branch is gone
        return []
    base = pull.base_ref if pull.state == "open" else pull.base_sha
    return await pulls.store.read(res.key, commits_ahead, base, pull.head_sha)


async def page_of(
    pulls: Pulls, res: RepoResource, pull: PullRequest, *, page: int, per_page: int
) -> list[PullCommitRead]:
    """One page of the pull request's commits (`page` from 1)."""
    found = (await commits_of(pulls, res, pull))[(page - 1) * per_page : page * per_page]
    api, html = f"{pulls.base_url}/api/v1/repos/{res.full_name}", f"{pulls.base_url}/{res.full_name}"
    return [commit_read(c, api, html) for c in found]
