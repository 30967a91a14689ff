"""Branch operations of a merge: delete a merged task branch, find a squash again after a crash.

Blocking functions: call them through `RepoStore.read/write` (a worker thread)."""

import pygit2


def delete_branch(repo: pygit2.Repository, branch: str, expected_sha: str) -> bool:
    """Delete a merged task branch, only while it still points at the merged head (a later push
    to it keeps it). Returns whether it was deleted."""
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None or str(ref.target) != expected_sha:
        return False
    try:
        ref.delete()
    except pygit2.GitError:
        return False  # moved under us (a push): keep it
    return True


def find_merged(repo: pygit2.Repository, branch: str, since_sha: str, head_sha: str, limit: int = 1000) -> str | None:
    """The commit on `branch`'s first-parent line (back to `since_sha`) that merged `head_sha`,
    recognised by its `Task-Head:` trailer: how a squash is found again after a crash."""
    ref = repo.references.get(f"refs/heads/{branch}")
    if ref is None:
        return None
    marker = f"\nTask-Head: {head_sha}\n"
    commit = repo[ref.target].peel(pygit2.Commit)
    for _ in range(limit):
        if str(commit.id) == since_sha:
            return None
        if marker in commit.message:
            return str(commit.id)
        if not commit.parents:
            return None
        commit = commit.parents[0]
    return None
