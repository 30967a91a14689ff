"""plan_merge and merge on real bare repositories, checked with the real git CLI.

"ours" is the base branch (main), "theirs" the head commit (a feature branch).
"""

import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pygit2
import pytest
from pygit2.references import References

from forge.git import (
    BaseMoved,
    MergeConflictFile,
    MergeConflicts,
    MergeResult,
    NotFastForward,
    NothingToMerge,
    RefConflict,
    RefNotFound,
    UnrelatedHistories,
    bare,
    merge,
    plan_merge,
    ref_locks,
)
from forge.git.merge import MergeStrategy
from forge.git.names import repo_path
from forge.git.ref_locks import STALE_SECONDS as STALE_REF_LOCK_SECONDS
from forge.git.schemas import Identity
from tests.support.waiting import event_sync

ALICE = Identity(name="Alice", email="alice@example.com")
BOB = Identity(name="Bob Merger", email="bob@example.com")
WHEN = datetime(2024, 5, 1, 12, 0, tzinfo=timezone(timedelta(hours=2)))
LINK = 0o120000
STRATEGIES: tuple[MergeStrategy, ...] = ("merge", "squash", "fast-forward")


def git_bytes(cwd: Path, *args: str) -> bytes:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "T",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "T",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True).stdout


def git(cwd: Path, *args: str) -> str:
    return git_bytes(cwd, *args).decode()


class Repo:
    """A bare forgehand repository under test, written with pygit2 and read with git."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.repo = bare.open_repo(path)

    def commit(
        self,
        branch: str,
        files: Mapping[str, bytes | str | None],
        *,
        start: str | None = None,
        modes: Mapping[str, int] | None = None,
        message: str = "change",
    ) -> str:
        """Commit on ``branch``, creating it at ``start`` (a sha) first when given."""
        if start is not None:
            bare.update_ref(self.repo, f"refs/heads/{branch}", start, expected_old=None)
        return bare.write_commit(self.repo, branch=branch, files=files, modes=modes, message=message, author=ALICE)

    def tip(self, branch: str = "main") -> str:
        return git(self.path, "rev-parse", f"refs/heads/{branch}").strip()

    def parents(self, sha: str) -> list[str]:
        return git(self.path, "log", "-1", "--format=%P", sha).split()

    def file(self, rev: str, path: str) -> bytes:
        return git_bytes(self.path, "cat-file", "blob", f"{rev}:{path}")

    def files(self, rev: str) -> list[str]:
        return git(self.path, "ls-tree", "-r", "--name-only", rev).split()

    def tree(self, rev: str) -> str:
        return git(self.path, "rev-parse", f"{rev}^{{tree}}").strip()

    def refs(self) -> str:
        return git(self.path, "for-each-ref", "--format=%(refname) %(objectname)")

    def reflog(self, branch: str = "main") -> list[str]:
        out = git(self.path, "reflog", "show", "--format=%H %gn <%ge> %gs", f"refs/heads/{branch}", "--")
        return out.splitlines()


@pytest.fixture
def r(tmp_path: Path) -> Repo:
    """main: a.txt, b.txt, c.txt at the root commit."""
    path = repo_path(tmp_path / "repos", "alice", "r")
    bare.init_repo(path)
    repo = Repo(path)
    repo.commit("main", {"a.txt": "a1\na2\na3\n", "b.txt": "b1\nb2\nb3\n", "c.txt": "c\n"}, message="root")
    return repo


def do_merge(r: Repo, head: str, strategy: MergeStrategy, **kwargs: object) -> MergeResult:
    options: dict[str, object] = {"expected_base_sha": None, "author": ALICE, "message": "Merge feature"}
    options.update(kwargs)
    return merge(r.repo, base_branch="main", head_sha=head, strategy=strategy, **options)  # type: ignore[arg-type]


def diverged(r: Repo) -> tuple[str, str, str]:
    """feature changes a.txt, main changes b.txt; returns (root, main tip, feature tip)."""
    root = r.tip()
    feature = r.commit("feature", {"a.txt": "a1\nA2\na3\n", "new.txt": "new\n"}, start=root, message="feature")
    main = r.commit("main", {"b.txt": "b1\nB2\nb3\n"}, message="main moves on")
    return root, main, feature


# --- clean merges -----------------------------------------------------------------------------------


def test_merge_commit_has_both_parents_the_merged_tree_and_the_identities(r: Repo) -> None:
    root, main, feature = diverged(r)
    plan = plan_merge(r.repo, "main", feature, "merge")
    assert (plan.base_sha, plan.head_sha, plan.merge_base) == (main, feature, root)
    assert plan.mergeable and plan.blocker is None and plan.conflicts == []
    assert not plan.fast_forward_possible and not plan.up_to_date
    assert r.tip() == main  # planning moved nothing

    result = do_merge(r, feature, "merge", committer=BOB, message="Merge feature\n\nTask 7\n", when=WHEN)

    assert result == MergeResult(strategy="merge", old_base_sha=main, new_base_sha=r.tip(), head_sha=feature)
    assert r.parents(r.tip()) == [main, feature]
    assert r.file("main", "a.txt") == b"a1\nA2\na3\n"
    assert r.file("main", "b.txt") == b"b1\nB2\nb3\n"
    assert r.file("main", "new.txt") == b"new\n"
    assert r.tip("feature") == feature
    log = git(r.path, "log", "-1", "--format=%an <%ae> %aI|%cn <%ce> %cI|%B", "main")
    assert log.strip() == (
        "Alice <alice@example.com> 2024-05-01T12:00:00+02:00|"
        "Bob Merger <bob@example.com> 2024-05-01T12:00:00+02:00|Merge feature\n\nTask 7"
    )
    # The reflog records the move, by the committer; the caller's repository object is unchanged.
    assert (
        r.reflog()[0]
        == f"{result.new_base_sha} Bob Merger <bob@example.com> forgehand merge {feature} (merge): Merge feature"
    )
    assert r.repo.ident == (None, None)
    git(r.path, "fsck", "--strict")


def test_squash_is_one_commit_on_base_with_both_changes(r: Repo) -> None:
    _root, main, feature = diverged(r)
    result = do_merge(r, feature, "squash", message="Squashed feature")
    tip = r.tip()
    assert result.new_base_sha == tip and result.old_base_sha == main
    assert r.parents(tip) == [main]
    assert r.file(tip, "a.txt") == b"a1\nA2\na3\n"
    assert r.file(tip, "b.txt") == b"b1\nB2\nb3\n"
    assert sorted(r.files(tip)) == ["a.txt", "b.txt", "c.txt", "new.txt"]
    assert git(r.path, "log", "-1", "--format=%s", tip).strip() == "Squashed feature"
    # A squash does not record the head: the feature branch is still not merged as far as git knows.
    is_ancestor = subprocess.run(["git", "merge-base", "--is-ancestor", feature, "main"], cwd=r.path, check=False)
    assert is_ancestor.returncode == 1
    git(r.path, "fsck", "--strict")


def test_fast_forward_moves_base_to_head(r: Repo) -> None:
    root = r.tip()
    first = r.commit("feature", {"a.txt": "x\n"}, start=root)
    feature = r.commit("feature", {"d.txt": "d\n"})
    plan = plan_merge(r.repo, "main", feature, "fast-forward")
    assert plan.fast_forward_possible and plan.mergeable and plan.merge_base == root

    result = do_merge(r, feature, "fast-forward", committer=BOB)

    assert result == MergeResult(strategy="fast-forward", old_base_sha=root, new_base_sha=feature, head_sha=feature)
    assert r.tip() == feature and r.parents(feature) == [first]
    assert r.reflog()[0] == f"{feature} Bob Merger <bob@example.com> forgehand merge {feature}: fast-forward"


def test_merge_and_squash_when_a_fast_forward_was_possible(r: Repo) -> None:
    root = r.tip()
    feature = r.commit("feature", {"a.txt": "x\n"}, start=root)
    merged = do_merge(r, feature, "merge")
    assert r.parents(merged.new_base_sha) == [root, feature]  # a real merge commit, not a fast-forward
    assert r.tree(merged.new_base_sha) == r.tree(feature)

    other = r.commit("other", {"c.txt": "changed\n"}, start=merged.new_base_sha)
    squashed = do_merge(r, other, "squash")
    assert r.parents(squashed.new_base_sha) == [merged.new_base_sha]
    assert r.tree(squashed.new_base_sha) == r.tree(other)


def test_fast_forward_refused_when_histories_diverged(r: Repo) -> None:
    _root, main, feature = diverged(r)
    plan = plan_merge(r.repo, "main", feature, "fast-forward")
    assert not plan.fast_forward_possible and not plan.mergeable and plan.blocker == "not_fast_forward"
    with pytest.raises(NotFastForward) as err:
        do_merge(r, feature, "fast-forward")
    assert err.value.code == "not_fast_forward"
    assert r.tip() == main


# --- conflicts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["merge", "squash"])
def test_content_conflicts_reported_file_by_file_and_nothing_moves(r: Repo, strategy: MergeStrategy) -> None:
    root = r.tip()
    feature = r.commit(
        "feature", {"a.txt": "a1\nTHEIRS\na3\n", "b.txt": "b1\nb2\nTHEIRS\n", "c.txt": "ok\n"}, start=root
    )
    r.commit("main", {"a.txt": "a1\nOURS\na3\n", "b.txt": "b1\nb2\nOURS\n"})
    refs_before, reflog_before = r.refs(), r.reflog()

    plan = plan_merge(r.repo, "main", feature, strategy)
    expected = [
        MergeConflictFile(path=p, kind="content", ancestor_path=p, our_path=p, their_path=p, binary=False)
        for p in ("a.txt", "b.txt")
    ]
    assert plan.conflicts == expected
    assert not plan.mergeable and plan.blocker == "merge_conflict"

    with pytest.raises(MergeConflicts) as err:
        do_merge(r, feature, strategy)
    assert err.value.code == "merge_conflict"
    assert err.value.conflicts == expected
    assert "a.txt" in str(err.value) and "b.txt" in str(err.value)
    assert r.refs() == refs_before and r.reflog() == reflog_before


def test_modify_delete_delete_modify_and_add_add(r: Repo) -> None:
    root = r.tip()
    feature = r.commit("feature", {"a.txt": None, "b.txt": "b1\nTHEIRS\nb3\n", "both.txt": "theirs\n"}, start=root)
    main = r.commit("main", {"a.txt": "a1\nOURS\na3\n", "b.txt": None, "both.txt": "ours\n"})

    with pytest.raises(MergeConflicts) as err:
        do_merge(r, feature, "merge")
    assert err.value.conflicts == [
        MergeConflictFile(path="a.txt", kind="modify/delete", ancestor_path="a.txt", our_path="a.txt", their_path=None),
        MergeConflictFile(path="b.txt", kind="delete/modify", ancestor_path="b.txt", our_path=None, their_path="b.txt"),
        MergeConflictFile(
            path="both.txt", kind="add/add", ancestor_path=None, our_path="both.txt", their_path="both.txt"
        ),
    ]
    assert r.tip() == main


def test_binary_and_symlink_conflicts_are_reported(r: Repo) -> None:
    root = r.commit(
        "main",
        {"img.bin": b"\x89PNG\0\0base" * 50, "plain.bin": b"\0\1\2", "link": "a.txt"},
        modes={"link": LINK},
    )
    feature = r.commit(
        "feature",
        {"img.bin": b"\x89PNG\0\0theirs" * 50, "link": "b.txt", "plain.bin": b"\0\1\2\3"},
        start=root,
        modes={"link": LINK},
    )
    main = r.commit("main", {"img.bin": b"\x89PNG\0\0ours" * 50, "link": "c.txt"}, modes={"link": LINK})

    plan = plan_merge(r.repo, "main", feature, "merge")
    assert plan.conflicts == [
        MergeConflictFile(path="img.bin", kind="content", ancestor_path="img.bin", our_path="img.bin",
                          their_path="img.bin", binary=True),
        MergeConflictFile(path="link", kind="content", ancestor_path="link", our_path="link", their_path="link"),
    ]  # fmt: skip
    with pytest.raises(MergeConflicts):
        do_merge(r, feature, "merge")
    assert r.tip() == main

    # Once the conflicting sides agree, the one-sided binary change merges byte for byte.
    r.commit("main", {"img.bin": b"\x89PNG\0\0theirs" * 50, "link": "b.txt"}, modes={"link": LINK})
    result = do_merge(r, feature, "merge")
    assert r.file(result.new_base_sha, "plain.bin") == b"\0\1\2\3"
    assert git(r.path, "ls-tree", result.new_base_sha, "link").startswith("120000 blob")
    assert r.file(result.new_base_sha, "link") == b"b.txt"


def test_rename_conflicts_are_joined_with_the_paths_of_each_side(r: Repo) -> None:
    long = "".join(f"line {i}\n" for i in range(40))
    root = r.commit("main", {"moved.txt": long, "twice.txt": long.upper()})
    feature = r.commit(
        "feature",
        {"moved.txt": long.replace("line 3\n", "THEIRS\n"), "twice.txt": None, "twice-theirs.txt": long.upper()},
        start=root,
    )
    r.commit(
        "main",
        {"moved.txt": None, "moved-ours.txt": long.replace("line 3\n", "OURS\n"),
         "twice.txt": None, "twice-ours.txt": long.upper()},
    )  # fmt: skip

    plan = plan_merge(r.repo, "main", feature, "squash")
    assert plan.conflicts == [
        MergeConflictFile(path="moved.txt", kind="rename", ancestor_path="moved.txt", our_path="moved-ours.txt",
                          their_path="moved.txt"),
        MergeConflictFile(path="twice.txt", kind="rename", ancestor_path="twice.txt", our_path="twice-ours.txt",
                          their_path="twice-theirs.txt"),
    ]  # fmt: skip


# --- nothing to merge, unrelated, missing --------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_head_already_in_base_is_nothing_to_merge(r: Repo, strategy: MergeStrategy) -> None:
    root = r.tip()
    main = r.commit("main", {"a.txt": "later\n"})
    for head in (main, root):
        plan = plan_merge(r.repo, "main", head, strategy)
        assert plan.up_to_date and not plan.fast_forward_possible and plan.blocker == "nothing_to_merge"
        with pytest.raises(NothingToMerge) as err:
            do_merge(r, head, strategy)
        assert err.value.code == "nothing_to_merge"
    assert r.tip() == main


def test_squash_that_changes_nothing_is_refused_but_a_merge_commit_is_not(r: Repo) -> None:
    root = r.tip()
    feature = r.commit("feature", {"a.txt": "same change\n"}, start=root, message="the change")
    main = r.commit("main", {"a.txt": "same change\n"}, message="cherry-picked")  # main has it already
    plan = plan_merge(r.repo, "main", feature, "squash")
    assert not plan.up_to_date and plan.blocker == "nothing_to_merge"
    with pytest.raises(NothingToMerge):
        do_merge(r, feature, "squash")
    assert r.tip() == main
    merged = do_merge(r, feature, "merge")
    assert r.parents(merged.new_base_sha) == [main, feature]


def test_unrelated_histories_are_refused(r: Repo) -> None:
    main = r.tip()
    orphan = bare.write_commit(r.repo, branch="orphan", files={"z.txt": "z\n"}, message="orphan", author=ALICE)
    plan = plan_merge(r.repo, "main", orphan, "merge")
    assert plan.merge_base is None and plan.blocker == "unrelated_histories"
    with pytest.raises(UnrelatedHistories):
        do_merge(r, orphan, "merge")
    with pytest.raises(NotFastForward):
        do_merge(r, orphan, "fast-forward")
    assert r.tip() == main


def test_missing_branch_or_head_commit(r: Repo) -> None:
    main = r.tip()
    with pytest.raises(RefNotFound):
        plan_merge(r.repo, "nope", main, "merge")
    blob = git(r.path, "rev-parse", "main:a.txt").strip()
    tree = r.tree("main")
    for head in ("0" * 40, blob, tree, main[:12], "main", ""):
        with pytest.raises(RefNotFound):
            do_merge(r, head, "merge")
    assert plan_merge(r.repo, "main", main.upper(), "merge").head_sha == main


# --- compare-and-swap -------------------------------------------------------------------------------


def test_stale_expected_base_sha_is_base_moved_and_nothing_changes(r: Repo) -> None:
    root, main, feature = diverged(r)
    refs_before = r.refs()
    with pytest.raises(BaseMoved) as err:
        do_merge(r, feature, "merge", expected_base_sha=root)
    assert (err.value.expected, err.value.actual, err.value.code) == (root, main, "base_moved")
    assert isinstance(err.value, RefConflict)
    assert r.refs() == refs_before
    assert do_merge(r, feature, "merge", expected_base_sha=main).old_base_sha == main


def prepare_push(r: Repo, tmp_path: Path, files: Mapping[str, str]) -> tuple[str, Callable[[], bool]]:
    """A clone with a new commit on main, and a function that runs a real ``git push`` of it
    (receive-pack) and says whether git accepted it."""
    clone = tmp_path / f"clone-{time.monotonic_ns()}"
    git(tmp_path, "clone", "-q", str(r.path), str(clone))
    for name, content in files.items():
        (clone / name).write_text(content)
    git(clone, "add", "-A")
    git(clone, "commit", "-qm", "pushed meanwhile")

    def push() -> bool:
        try:
            git(clone, "push", "-q", "origin", "HEAD:refs/heads/main")
        except subprocess.CalledProcessError:
            return False
        return True

    return git(clone, "rev-parse", "HEAD").strip(), push


def test_push_between_plan_and_merge_is_base_moved(r: Repo, tmp_path: Path) -> None:
    _root, _main, feature = diverged(r)
    plan = plan_merge(r.repo, "main", feature, "merge")
    pushed, push = prepare_push(r, tmp_path, {"c.txt": "pushed\n"})
    assert push()
    with pytest.raises(BaseMoved) as err:
        do_merge(r, feature, "merge", expected_base_sha=plan.base_sha)
    assert (err.value.expected, err.value.actual) == (plan.base_sha, pushed)
    assert r.tip() == pushed and r.file("main", "c.txt") == b"pushed\n"


class RacingRepository(pygit2.Repository):
    """Runs ``action`` once, at a chosen moment of a merge, as another writer would:
    ``computing``: after the merge read the base tip (at its ``merge_base`` call);
    ``swapping``: when, after that, the merge reads the base ref again to swap it."""

    def __init__(self, path: Path, moment: str, action: Callable[[], None]) -> None:
        super().__init__(str(path))
        self.moment = moment
        self.action: Callable[[], None] | None = action
        self.computed = False
        self.references = HookedReferences(self)

    def fire(self) -> None:
        if self.action is not None:
            action, self.action = self.action, None
            action()

    def merge_base(self, oid1: str | pygit2.Oid, oid2: str | pygit2.Oid) -> pygit2.Oid:
        self.computed = True
        if self.moment == "computing":
            self.fire()
        return super().merge_base(oid1, oid2)


class HookedReferences(References):
    def __init__(self, repo: RacingRepository) -> None:
        super().__init__(repo)
        self.racing = repo

    def get(self, key: str) -> pygit2.Reference | None:
        if self.racing.computed and self.racing.moment == "swapping" and key == "refs/heads/main":
            self.racing.fire()
        return super().get(key)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_push_landing_while_the_merge_is_computed_is_never_overwritten(
    r: Repo, tmp_path: Path, strategy: MergeStrategy
) -> None:
    """No expected_base_sha: only the compare-and-swap of the ref update can catch this push."""
    root = r.tip()
    feature = r.commit("feature", {"a.txt": "feature\n"}, start=root)
    pushed, push = prepare_push(r, tmp_path, {"c.txt": "pushed\n"})
    accepted: list[bool] = []
    racing = RacingRepository(r.path, "computing", lambda: accepted.append(push()))
    with pytest.raises(BaseMoved) as err:
        merge(racing, base_branch="main", head_sha=feature, strategy=strategy, expected_base_sha=None,
              author=ALICE, message="m")  # fmt: skip
    assert accepted == [True]
    assert (err.value.expected, err.value.actual) == (root, pushed)
    assert r.tip() == pushed and r.file("main", "c.txt") == b"pushed\n"


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_push_racing_the_ref_update_itself_is_refused_by_git(r: Repo, tmp_path: Path, strategy: MergeStrategy) -> None:
    """The push arrives while the merge compares the tip and writes it: the merge holds git's
    lock on the ref then, so receive-pack must fail to take it (the other order is the test
    above). A read-compare-write without the lock would let the push through and then
    overwrite it."""
    root = r.tip()
    feature = r.commit("feature", {"a.txt": "feature\n"}, start=root)
    _pushed, push = prepare_push(r, tmp_path, {"c.txt": "pushed\n"})
    accepted: list[bool] = []
    racing = RacingRepository(r.path, "swapping", lambda: accepted.append(push()))
    result = merge(racing, base_branch="main", head_sha=feature, strategy=strategy, expected_base_sha=None,
                   author=ALICE, message="m")  # fmt: skip
    assert accepted == [False]
    assert r.tip() == result.new_base_sha and result.old_base_sha == root
    assert r.file("main", "c.txt") == b"c\n" and r.file("main", "a.txt") == b"feature\n"


def test_ref_locked_by_another_writer_is_waited_for_then_refused(r: Repo) -> None:
    _root, main, feature = diverged(r)
    lock = r.path / "refs" / "heads" / "main.lock"
    lock.write_text("held by receive-pack\n")
    started = time.monotonic()
    with pytest.raises(RefConflict) as err:
        do_merge(r, feature, "merge", lock_timeout=0.3)
    assert time.monotonic() - started >= 0.3
    assert not isinstance(err.value, BaseMoved) and "locked" in str(err.value)
    assert r.tip() == main
    assert lock.read_text() == "held by receive-pack\n"  # somebody else's lock is left alone
    lock.unlink()
    assert do_merge(r, feature, "merge").old_base_sha == main


def test_a_lock_left_by_a_writer_that_died_is_removed_and_the_merge_lands(r: Repo) -> None:
    """A process killed while it held the ref's lock (a merge cut by SIGKILL) leaves the file
    behind; once it is older than any live update holds one, it no longer blocks the branch."""
    _root, main, feature = diverged(r)
    lock = r.path / "refs" / "heads" / "main.lock"
    lock.write_text("")
    old = time.time() - STALE_REF_LOCK_SECONDS - 1
    os.utime(lock, (old, old))
    result = do_merge(r, feature, "merge", lock_timeout=0.3)
    assert result.old_base_sha == main and r.tip() == result.new_base_sha
    assert not lock.exists()


def test_lock_holder_that_moves_the_ref_wins(r: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    """What receive-pack does: write the new value into ``<ref>.lock``, rename it over the ref."""
    _root, main, feature = diverged(r)
    theirs = r.commit("elsewhere", {"c.txt": "other writer\n"}, start=main)
    heads = r.path / "refs" / "heads"
    (heads / "main.lock").write_text(theirs + "\n")
    merge_waits = threading.Event()
    remove_if_stale = ref_locks.remove_if_stale

    def found_locked(path: Path) -> bool:
        merge_waits.set()  # the merge found the lock taken (and the ref not moved yet)
        return remove_if_stale(path)

    monkeypatch.setattr(ref_locks, "remove_if_stale", found_locked)

    def finish_update() -> None:
        event_sync(merge_waits, timeout=30, what="the merge to wait for the lock")
        (heads / "main.lock").rename(heads / "main")

    writer = threading.Thread(target=finish_update)
    writer.start()
    try:
        with pytest.raises(BaseMoved) as err:
            do_merge(r, feature, "merge", lock_timeout=5)
    finally:
        writer.join()
    assert (err.value.expected, err.value.actual) == (main, theirs)
    assert r.tip() == theirs


def imported(tmp_path: Path, n_heads: int, *, diverge: bool) -> tuple[Path, str, list[str]]:
    """A repository imported from a git work tree (its refs packed, as after a mirror clone):
    main plus ``n_heads`` branches off it, each changing its own file."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    for i in range(n_heads):
        (work / f"f{i}.txt").write_text("base\n")
    git(work, "add", "-A")
    git(work, "commit", "-qm", "root")
    for i in range(n_heads):
        git(work, "checkout", "-qb", f"h{i}", "main")
        (work / f"f{i}.txt").write_text(f"head {i}\n")
        git(work, "commit", "-qam", f"head {i}")
    git(work, "checkout", "-q", "main")
    if diverge:
        (work / "main.txt").write_text("main\n")
        git(work, "add", "-A")
        git(work, "commit", "-qm", "main moves on")
    path = repo_path(tmp_path / "repos", "alice", "race")
    bare.import_repo(path, str(work))
    heads = [git(path, "rev-parse", f"h{i}").strip() for i in range(n_heads)]
    return path, git(path, "rev-parse", "main").strip(), heads


def race(path: Path, heads: list[str], strategy: MergeStrategy, expected: str | None) -> list[MergeResult | Exception]:
    """Merge every head into main at once, each thread with its own repository (as ``RepoStore``
    runs them)."""
    barrier = threading.Barrier(len(heads))
    outcomes: list[MergeResult | Exception] = [RuntimeError("not run")] * len(heads)

    def run(i: int) -> None:
        repo = bare.open_repo(path)
        try:
            barrier.wait()
            outcomes[i] = merge(
                repo,
                base_branch="main",
                head_sha=heads[i],
                strategy=strategy,
                expected_base_sha=expected,
                author=ALICE,
                message=f"merge h{i}",
            )
        except Exception as exc:
            outcomes[i] = exc
        finally:
            repo.free()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(heads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_concurrent_merges_with_the_same_expected_base_exactly_one_wins(
    tmp_path: Path, strategy: MergeStrategy
) -> None:
    n = 8
    path, base, heads = imported(tmp_path, n, diverge=strategy != "fast-forward")
    assert "refs/heads/main" in (path / "packed-refs").read_text()
    reflog_before = Repo(path).reflog()

    outcomes = race(path, heads, strategy, base)

    winners = [(i, o) for i, o in enumerate(outcomes) if isinstance(o, MergeResult)]
    losers = [o for o in outcomes if not isinstance(o, MergeResult)]
    assert len(winners) == 1, outcomes
    index, won = winners[0]
    assert all(isinstance(o, BaseMoved) and o.actual == won.new_base_sha for o in losers), losers
    after = Repo(path)
    assert after.tip() == won.new_base_sha and won.old_base_sha == base and won.head_sha == heads[index]
    expected_parents = {"merge": [base, heads[index]], "squash": [base], "fast-forward": [base]}
    assert after.parents(after.tip()) == expected_parents[strategy]
    assert after.file("main", f"f{index}.txt") == f"head {index}\n".encode()
    assert all(after.file("main", f"f{i}.txt") == b"base\n" for i in range(n) if i != index)
    assert len(after.reflog()) == len(reflog_before) + 1
    git(path, "fsck", "--strict")


@pytest.mark.parametrize("strategy", ["merge", "squash"])
def test_concurrent_merges_without_expected_base_lose_nothing(tmp_path: Path, strategy: MergeStrategy) -> None:
    """Each merge is computed on the tip it read and swapped in only if that tip is still there:
    the successful merges form one chain from the old tip, and every one of them is in the result."""
    n = 8
    path, base, heads = imported(tmp_path, n, diverge=True)

    outcomes = race(path, heads, strategy, None)

    won = {o.old_base_sha: o for o in outcomes if isinstance(o, MergeResult)}
    assert won and all(isinstance(o, MergeResult | BaseMoved) for o in outcomes), outcomes
    assert len(won) == sum(isinstance(o, MergeResult) for o in outcomes)  # no two from the same tip
    chain, tip = [], base
    while tip in won:
        chain.append(won[tip])
        tip = won[tip].new_base_sha
    assert len(chain) == len(won)
    after = Repo(path)
    assert after.tip() == tip
    merged = {heads.index(o.head_sha) for o in chain}
    for i in range(n):
        assert after.file("main", f"f{i}.txt") == (f"head {i}\n".encode() if i in merged else b"base\n")
    git(path, "fsck", "--strict")
