"""Domain errors of the git layer.

The host maps them to HTTP problem details; nothing here knows about HTTP. Every error carries a
stable ``code`` so that the mapping is a table lookup.
"""

from __future__ import annotations

from collections.abc import Sequence

from forge.git.schemas import MergeConflictFile


class RepoError(Exception):
    """Base class of every error raised by ``forge.git``."""

    code = "repo_error"


class InvalidName(RepoError, ValueError):
    """An owner or repository name that is not acceptable."""

    code = "invalid_name"


class InvalidRefName(RepoError, ValueError):
    """A ref or branch name that git would refuse (or that we refuse)."""

    code = "invalid_ref_name"


class InvalidPath(RepoError, ValueError):
    """A tree path with ``..``, a leading slash, NUL, a ``.git`` component ..."""

    code = "invalid_path"


class RepoNotFound(RepoError, LookupError):
    """No repository on disk at the expected place."""

    code = "repo_not_found"


class RepoExists(RepoError):
    """A repository (or a directory) already occupies the target place."""

    code = "repo_exists"


class RefNotFound(RepoError, LookupError):
    """A ref, branch, tag or commit id that does not resolve to a commit."""

    code = "ref_not_found"


class PathNotFound(RepoError, LookupError):
    """A tree path that does not exist at the given commit."""

    code = "path_not_found"


class NotABlob(RepoError, ValueError):
    """The path names a tree (or a submodule) where a file was expected."""

    code = "not_a_blob"


class NotATree(RepoError, ValueError):
    """The path names a file where a directory was expected."""

    code = "not_a_tree"


class ImportFailed(RepoError):
    """``git clone --mirror`` or the ``git fsck`` after it failed."""

    code = "import_failed"


class GitCommandFailed(RepoError):
    """A git subprocess exited with an error."""

    code = "git_failed"

    def __init__(self, message: str, *, returncode: int | None = None, stderr: str = "") -> None:
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


class GitProtocolError(RepoError, ValueError):
    """A smart HTTP request body that does not follow the git wire protocol."""

    code = "git_protocol_error"


class UnsupportedService(RepoError, ValueError):
    """A smart HTTP service other than ``git-upload-pack`` and ``git-receive-pack``."""

    code = "unsupported_service"


class UnsupportedEncoding(RepoError, ValueError):
    """A request ``Content-Encoding`` other than identity and gzip."""

    code = "unsupported_encoding"


class PushTooLarge(RepoError):
    """The (decoded) request body passed the configured size limit."""

    code = "push_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than the limit of {limit} bytes")
        self.limit = limit


class RefConflict(RepoError):
    """A compare-and-swap ref update found the ref somewhere else than expected."""

    code = "ref_conflict"


class BaseMoved(RefConflict):
    """The base branch of a merge is no longer at the commit the merge was planned (or computed)
    against: someone pushed or merged meanwhile. Nothing was changed."""

    code = "base_moved"

    def __init__(self, expected: str, actual: str | None, *, branch: str | None = None) -> None:
        where = f"branch {branch!r}" if branch else "the base branch"
        now = f"is at {actual}" if actual is not None else "no longer exists"
        super().__init__(f"{where} {now}, expected {expected}")
        self.expected = expected
        self.actual = actual


class Fenced(RefConflict):
    """A run's git write was refused: another worker took the run over (its fence was revoked,
    `forge.git.fences`). Nothing was changed."""

    code = "run_fenced"

    def __init__(self, run_uuid: str) -> None:
        super().__init__(f"run {run_uuid} was taken over by another worker: its writes are refused")
        self.run_uuid = run_uuid


class MergeConflicts(RepoError):
    """The merge cannot be done without a person resolving conflicts; ``conflicts`` lists the
    files."""

    code = "merge_conflict"

    def __init__(self, conflicts: Sequence[MergeConflictFile]) -> None:
        paths = ", ".join(c.path for c in conflicts[:10])
        more = f" and {len(conflicts) - 10} more" if len(conflicts) > 10 else ""
        super().__init__(f"{len(conflicts)} conflicting file(s): {paths}{more}")
        self.conflicts = list(conflicts)


class NotFastForward(RepoError):
    """A fast-forward was asked for, but the base branch is not an ancestor of the head."""

    code = "not_fast_forward"


class NothingToMerge(RepoError):
    """The head is already contained in the base branch, or a squash would change nothing."""

    code = "nothing_to_merge"


class UnrelatedHistories(RepoError):
    """The base branch and the head share no commit (git refuses such merges by default)."""

    code = "unrelated_histories"
