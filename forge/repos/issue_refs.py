"""References between issues and pull requests (docs/issues.md, "References").

- `#N` in an issue, a comment or a pull request's description puts a `cross-referenced` entry on
  issue N's timeline (once per source), naming where it was mentioned.
- `Fixes #N`, `Closes #N` or `Resolves #N` (any tense, any case) in a pull request's description
  or in the message of a commit it merges closes issue N when that pull request merges, with the
  pull request named on the issue's timeline and in `issue.closed` (`closed_by_pull_request`).

Text in code spans and fenced code blocks refers to nothing. Only this repository's issues are
referenced (`owner/name#N` is out of scope)."""

from dataclasses import dataclass

from sqlalchemy import select

from forge.db.audit import Actor
from forge.db.issue_models import Issue, IssueEvent
from forge.repos.issue_base import IssueBase
from forge.repos.repositories import RepoResource
from forge.repos.text_refs import MAX_REFERENCES, closing_references, references


@dataclass(frozen=True)
class Source:
    """What mentioned an issue: an issue or a pull request (by number), maybe through a comment."""

    kind: str  # "issue" | "pull_request"
    number: int
    title: str
    comment_id: int | None = None


@dataclass
class IssueRefs(IssueBase):
    async def cross_reference(self, actor: Actor, res: RepoResource, source: Source, text: str) -> list[int]:
        """Put `cross-referenced` on the timeline of each issue the text names (not the source
        itself; once per source and issue). Returns the issue numbers marked."""
        numbers = [n for n in references(text) if not (source.kind == "issue" and n == source.number)]
        if not numbers:
            return []
        issues = list(
            (
                await self.session.execute(select(Issue).where(Issue.repo_id == res.repo.id, Issue.number.in_(numbers)))
            ).scalars()
        )
        marked = []
        for issue in issues:
            if await self._already(issue, source):
                continue
            self.record(
                issue, actor, "cross-referenced",
                source={"type": source.kind, "number": source.number, "title": source.title},
                **({"comment_id": source.comment_id} if source.comment_id else {}),
            )  # fmt: skip
            marked.append(issue.number)
        return marked

    async def _already(self, issue: Issue, source: Source) -> bool:
        rows = await self.session.execute(
            select(IssueEvent.data).where(IssueEvent.issue_id == issue.id, IssueEvent.event == "cross-referenced")
        )
        for (data,) in rows.all():
            src = (data or {}).get("source") or {}
            if src.get("type") == source.kind and src.get("number") == source.number:
                return True
        return False

    async def issues_closed_by(self, res: RepoResource, texts: list[str]) -> list[Issue]:
        """The open issues of this repository that these texts close (`Fixes #N`)."""
        numbers: list[int] = []
        for text in texts:
            numbers.extend(n for n in closing_references(text) if n not in numbers)
        numbers = numbers[:MAX_REFERENCES]
        if not numbers:
            return []
        stmt = (
            select(Issue)
            .where(Issue.repo_id == res.repo.id, Issue.number.in_(numbers), Issue.state == "open")
            .order_by(Issue.number)
            .with_for_update()
        )
        return list((await self.session.execute(stmt)).scalars())

    async def commit_references(self, actor: Actor, res: RepoResource, commits: list[tuple[str, str]]) -> None:
        """`referenced` on the timeline of each issue a pushed commit's message names (`#N`), once
        per commit and issue (GitHub's `referenced`)."""
        wanted = {n: sha for sha, message in reversed(commits) for n in references(message)}
        if not wanted:
            return
        stmt = select(Issue).where(Issue.repo_id == res.repo.id, Issue.number.in_(list(wanted)[:MAX_REFERENCES]))
        for issue in (await self.session.execute(stmt)).scalars():
            for sha, message in commits:
                if issue.number in references(message) and not await self._referenced(issue, sha):
                    summary = message.strip().splitlines()[0][:200] if message.strip() else ""
                    self.record(issue, actor, "referenced", commit_id=sha, message=summary)

    async def _referenced(self, issue: Issue, sha: str) -> bool:
        rows = await self.session.execute(
            select(IssueEvent.data).where(IssueEvent.issue_id == issue.id, IssueEvent.event == "referenced")
        )
        return any((data or {}).get("commit_id") == sha for (data,) in rows.all())
