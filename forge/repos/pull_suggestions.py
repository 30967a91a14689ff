"""Suggestions: a reviewer writes the replacement of a line in a line comment, as on GitHub,

    ```suggestion
    return 12
    ```

and the author (anyone with the write role) applies it as a commit on the head branch. The
commit replaces the commented line of the head's file with the block's lines (none: the line
goes), by compare-and-swap on the head the comment was written on: a suggestion on an older head
is refused (`head_moved`), never applied somewhere else. The pull request follows the new head
(`Pulls.after_push`) and the application is audited (`repo.pull.apply_suggestion`)."""

import pygit2

from forge.core.access import Action, require
from forge.core.error_codes import Code
from forge.core.errors import InvalidInput, InvalidState, NotFound
from forge.db import audit
from forge.db.audit import Actor
from forge.db.models import Account, PullComment
from forge.git import NotABlob, PathNotFound, RefConflict, RefUpdate, read_blob
from forge.git.bare import write_commit
from forge.repos import merge_rules
from forge.repos.pull_merge import identity
from forge.repos.pulls import Pulls
from forge.repos.repositories import RepoResource
from forge.repos.suggestion_text import suggestion_of

MAX_FILE = 1024 * 1024


def _replaced(text: str, line: int, lines: list[str]) -> str:
    old = text.splitlines(keepends=True)
    if not 1 <= line <= len(old):
        raise InvalidInput(f"line {line} is past the end of the file", code=Code.INVALID_REVIEW_LINE)
    ending = "\r\n" if old[line - 1].endswith("\r\n") else "\n"
    last_has_newline = old[line - 1].endswith(("\n", "\r"))
    new = [f"{s}{ending}" for s in lines]
    if new and not last_has_newline:
        new[-1] = new[-1].rstrip("\r\n")
    return "".join(old[: line - 1] + new + old[line:])


class Suggestions:
    def __init__(self, pulls: Pulls) -> None:
        self.pulls = pulls

    async def apply(self, actor: Actor, res: RepoResource, number: int, comment_id: int) -> str:
        """Commit the suggestion of line comment `comment_id` on the head; the new head."""
        require(actor.principal, Action.PULL_WRITE, res)
        pull = await self.pulls.get(res, number, lock=True)
        comment = await self.pulls.session.get(PullComment, comment_id)
        if comment is None or comment.pull_id != pull.id or comment.path is None or comment.line is None:
            raise NotFound(f"#{number} has no line comment {comment_id}", code=Code.NOT_FOUND)
        lines = suggestion_of(comment.body) if comment.in_reply_to_id is None else None
        if lines is None or comment.side != "RIGHT":
            raise InvalidInput("this comment suggests no change to the head's lines", code=Code.VALIDATION_FAILED)
        if pull.state != "open" or comment.commit_sha != pull.head_sha:
            raise InvalidState(
                f"the suggestion was written on {comment.commit_sha[:12]}, the head is now "
                f"{pull.head_sha[:12] or 'gone'}: it no longer applies as written",
                code=Code.HEAD_MOVED,
                head_sha=pull.head_sha,
            )
        await merge_rules.head_writable(self.pulls.session, res, pull.head_ref)
        reviewer = await self.pulls.session.get(Account, comment.author_id) if comment.author_id else None
        path, line = comment.path, comment.line
        message = f"Apply suggestion from @{reviewer.login if reviewer else 'a reviewer'}\n\nOn {path} line {line}.\n"
        who = identity(actor.principal.login or "forgehand", self.pulls.base_url)

        def commit(repo: pygit2.Repository) -> str:
            try:
                blob = read_blob(repo, pull.head_sha, path, max_text_bytes=MAX_FILE)
            except (PathNotFound, NotABlob):
                raise InvalidInput(f"{path} is not a file of the head", code=Code.INVALID_REVIEW_LINE) from None
            try:  # the bytes themselves: a file that is not UTF-8 is never rewritten with replacements
                text = repo[blob.sha].peel(pygit2.Blob).data.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None or blob.text is None or blob.is_binary or blob.is_symlink:
                raise InvalidInput(f"{path} is not a UTF-8 text file of at most 1 MiB", code=Code.VALIDATION_FAILED)
            files = {path: _replaced(text, line, lines)}
            return write_commit(
                repo,
                branch=pull.head_ref,
                files=files,
                modes={path: int(blob.mode, 8)},  # an executable stays executable
                message=message,
                author=who,
                expected_old=pull.head_sha,
            )

        before = pull.head_sha
        try:
            new_head = await self.pulls.store.write(res.key, commit)
        except RefConflict:
            raise InvalidState(f"{pull.head_ref} moved meanwhile: reload and try again", code=Code.HEAD_MOVED) from None
        audit.record(
            self.pulls.session,
            actor,
            "repo.pull.apply_suggestion",
            f"{res.full_name}#{pull.number}",
            comment=comment_id,
            before=before,
            after=new_head,
        )
        await self.pulls.after_push(actor, res, [RefUpdate(before, new_head, f"refs/heads/{pull.head_ref}")])
        return new_head
