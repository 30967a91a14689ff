"""compare and commit_diff on repositories built with the git CLI and pygit2."""

import os
import subprocess
from pathlib import Path

import msgspec
import pygit2
import pytest

from forge.git import bare as git_bare
from forge.git.compare import DiffLimits, commit_diff, commits_ahead, compare
from forge.git.errors import RefNotFound
from forge.git.names import repo_path
from forge.git.schemas import Comparison, FileDiff, Identity

ALICE = Identity(name="Alice", email="alice@example.com")


def git(cwd: Path, *args: str, input: bytes | None = None) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "T",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "T",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    return subprocess.run(
        ["git", *args], cwd=cwd, env=env, input=input, capture_output=True, check=True
    ).stdout.decode()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    return work


def commit_all(work: Path, message: str) -> str:
    git(work, "add", "-A")
    git(work, "commit", "-qm", message)
    return git(work, "rev-parse", "HEAD").strip()


def bare(work: Path, tmp_path: Path) -> pygit2.Repository:
    path = repo_path(tmp_path / "repos", "alice", "r")
    git_bare.import_repo(path, str(work))
    return git_bare.open_repo(path)


def by_path(files: list[FileDiff]) -> dict[str, FileDiff]:
    return {f.path: f for f in files}


def test_compare_ahead_behind_and_three_dot_diff(work: Path, tmp_path: Path) -> None:
    (work / "a.txt").write_text("line1\nline2\nline3\n")
    (work / "gone.txt").write_text("bye\n")
    base = commit_all(work, "base")
    git(work, "checkout", "-qb", "feature")
    (work / "a.txt").write_text("line1\nline2 changed\nline3\nline4\n")
    (work / "new.txt").write_text("new\n")
    (work / "gone.txt").unlink()
    commit_all(work, "feature 1")
    (work / "new.txt").write_text("new\nmore\n")
    commit_all(work, "feature 2")
    git(work, "checkout", "-q", "main")
    (work / "main-only.txt").write_text("main\n")
    commit_all(work, "main moves on")
    repo = bare(work, tmp_path)

    result = compare(repo, "main", "feature")
    assert result.merge_base_sha == base
    assert (result.ahead_by, result.behind_by) == (2, 1)
    assert [c.summary for c in result.commits] == ["feature 1", "feature 2"]
    assert not result.commits_truncated
    files = by_path(result.files)
    assert "main-only.txt" not in files  # three-dot: the diff starts at the merge base
    assert files["new.txt"].status == "added" and files["new.txt"].old_path is None
    assert files["gone.txt"].status == "deleted" and files["gone.txt"].new_sha is None
    a = files["a.txt"]
    assert a.status == "modified" and (a.additions, a.deletions) == (2, 1)
    hunk = a.hunks[0]
    assert hunk.header.startswith("@@ -1,3 +1,4 @@")
    assert [(ln.origin, ln.old_lineno, ln.new_lineno, ln.content) for ln in hunk.lines] == [
        (" ", 1, 1, "line1"),
        ("-", 2, None, "line2"),
        ("+", None, 2, "line2 changed"),
        (" ", 3, 3, "line3"),
        ("+", None, 4, "line4"),
    ]
    assert result.stats.files == 3
    assert (result.stats.additions, result.stats.deletions) == (4, 2)

    reverse = compare(repo, "feature", "main")
    assert (reverse.ahead_by, reverse.behind_by) == (1, 2)
    assert [f.path for f in reverse.files] == ["main-only.txt"]
    same = compare(repo, "main", "main")
    assert same.files == [] and same.commits == [] and same.ahead_by == 0

    # a wire shape: encodes to JSON and back
    assert msgspec.json.decode(msgspec.json.encode(result), type=Comparison) == result


def test_compare_unknown_refs(work: Path, tmp_path: Path) -> None:
    (work / "f").write_text("x")
    commit_all(work, "one")
    repo = bare(work, tmp_path)
    with pytest.raises(RefNotFound):
        compare(repo, "main", "nope")
    with pytest.raises(RefNotFound):
        compare(repo, "main~1", "main")


def test_renames_are_detected(work: Path, tmp_path: Path) -> None:
    body = "".join(f"line {i}\n" for i in range(50))
    (work / "old_name.py").write_text(body)
    (work / "moved.txt").write_text("exactly the same\n" * 10)
    commit_all(work, "base")
    git(work, "checkout", "-qb", "topic")
    git(work, "mv", "old_name.py", "new_name.py")
    (work / "new_name.py").write_text(body + "line 50\n")
    git(work, "mv", "moved.txt", "dir_moved.txt")
    commit_all(work, "rename")
    repo = bare(work, tmp_path)
    files = by_path(compare(repo, "main", "topic").files)
    assert set(files) == {"new_name.py", "dir_moved.txt"}
    renamed = files["new_name.py"]
    assert renamed.status == "renamed" and renamed.old_path == "old_name.py"
    assert renamed.similarity is not None and renamed.similarity > 90
    assert (renamed.additions, renamed.deletions) == (1, 0)
    pure = files["dir_moved.txt"]
    assert pure.status == "renamed" and pure.similarity == 100 and pure.hunks == []
    no_renames = compare(repo, "main", "topic", limits=DiffLimits(find_renames=False))
    assert {f.status for f in no_renames.files} == {"added", "deleted"}


def test_binary_and_mode_and_type_changes(work: Path, tmp_path: Path) -> None:
    (work / "blob.bin").write_bytes(b"\0\1\2\3" * 100)
    (work / "script.sh").write_text("echo\n")
    (work / "thing").write_text("file\n")
    commit_all(work, "base")
    git(work, "checkout", "-qb", "topic")
    (work / "blob.bin").write_bytes(b"\0\1\2\4" * 100)
    (work / "script.sh").chmod(0o755)
    (work / "thing").unlink()
    (work / "thing").symlink_to("script.sh")
    commit_all(work, "changes")
    repo = bare(work, tmp_path)
    files = by_path(compare(repo, "main", "topic").files)
    binary = files["blob.bin"]
    assert binary.is_binary and binary.hunks == [] and (binary.additions, binary.deletions) == (0, 0)
    mode = files["script.sh"]
    assert (mode.old_mode, mode.new_mode, mode.status) == ("100644", "100755", "modified")
    thing = files["thing"]
    assert (thing.status, thing.old_mode, thing.new_mode) == ("type_changed", "100644", "120000")
    assert [f.path for f in compare(repo, "main", "topic").files].count("thing") == 1


def test_huge_files_are_flagged_too_large(work: Path, tmp_path: Path) -> None:
    (work / "small.txt").write_text("a\n")
    commit_all(work, "base")
    git(work, "checkout", "-qb", "topic")
    (work / "huge.txt").write_text("x" * 80 + "\n" * 1 + ("y" * 99 + "\n") * 20_000)  # ~2 MB of text
    (work / "many_lines.txt").write_text("".join(f"{i}\n" for i in range(5000)))
    (work / "small.txt").write_text("b\n")
    commit_all(work, "big")
    repo = bare(work, tmp_path)
    result = compare(repo, "main", "topic")
    files = by_path(result.files)
    huge = files["huge.txt"]
    assert huge.too_large and huge.hunks == [] and not huge.is_binary
    lines = files["many_lines.txt"]
    assert lines.too_large and lines.hunks == [] and lines.additions == 5000
    small = files["small.txt"]
    assert not small.too_large and small.hunks
    budget = compare(repo, "main", "topic", limits=DiffLimits(max_file_lines=10_000, max_total_lines=4000))
    assert by_path(budget.files)["many_lines.txt"].too_large
    capped = compare(repo, "main", "topic", limits=DiffLimits(max_files=1))
    assert len(capped.files) == 1 and capped.files_truncated and capped.stats.files == 3


def test_commit_cap_keeps_the_newest(work: Path, tmp_path: Path) -> None:
    (work / "f").write_text("0")
    commit_all(work, "base")
    git(work, "checkout", "-qb", "topic")
    for i in range(1, 31):
        (work / "f").write_text(str(i))
        commit_all(work, f"c{i}")
    repo = bare(work, tmp_path)
    result = compare(repo, "main", "topic", max_commits=10)
    assert result.commits_truncated and result.ahead_by == 30
    assert [c.summary for c in result.commits] == [f"c{i}" for i in range(21, 31)]


def test_unrelated_histories(work: Path, tmp_path: Path) -> None:
    (work / "f").write_text("main\n")
    commit_all(work, "main")
    git(work, "checkout", "-q", "--orphan", "other")
    (work / "f").write_text("other\n")
    commit_all(work, "other")
    repo = bare(work, tmp_path)
    result = compare(repo, "main", "other")
    assert result.merge_base_sha is None
    assert (result.ahead_by, result.behind_by) == (1, 1)
    assert [f.path for f in result.files] == ["f"]


def test_commit_diff(work: Path, tmp_path: Path) -> None:
    (work / "a.txt").write_text("one\n")
    root = commit_all(work, "root")
    (work / "a.txt").write_text("one\ntwo")  # no newline at end
    second = commit_all(work, "second")
    repo = bare(work, tmp_path)
    first = commit_diff(repo, root)
    assert first.parent_sha is None and first.commit.sha == root
    assert [(f.path, f.status, f.additions) for f in first.files] == [("a.txt", "added", 1)]
    diff = commit_diff(repo, second[:8])
    assert diff.parent_sha == root
    lines = diff.files[0].hunks[0].lines
    assert [(ln.origin, ln.content, ln.no_newline) for ln in lines] == [(" ", "one", False), ("+", "two", True)]
    with_patch = commit_diff(repo, second, limits=DiffLimits(include_patch=True))
    assert with_patch.files[0].patch is not None and "+two" in with_patch.files[0].patch
    assert "\\ No newline at end of file" in with_patch.files[0].patch


def test_merge_commit_diff_is_against_first_parent(work: Path, tmp_path: Path) -> None:
    (work / "f").write_text("base\n")
    commit_all(work, "base")
    git(work, "checkout", "-qb", "side")
    (work / "side.txt").write_text("side\n")
    commit_all(work, "side")
    git(work, "checkout", "-q", "main")
    (work / "main.txt").write_text("main\n")
    commit_all(work, "main")
    git(work, "merge", "-q", "--no-edit", "side")
    repo = bare(work, tmp_path)
    diff = commit_diff(repo, "main")
    assert len(diff.commit.parents) == 2
    assert [f.path for f in diff.files] == ["side.txt"]


def test_commits_ahead_walks_once_per_pair_of_commits(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (work / "f").write_text("0")
    commit_all(work, "base")
    git(work, "checkout", "-qb", "topic")
    for i in range(1, 6):
        (work / "f").write_text(str(i))
        commit_all(work, f"c{i}")
    repo = bare(work, tmp_path)
    walks: list[str] = []
    real_walk = pygit2.Repository.walk

    def counted(self: pygit2.Repository, *args: object) -> object:
        walks.append(str(args[0]))
        return real_walk(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(pygit2.Repository, "walk", counted)
    first = commits_ahead(repo, "main", "topic", max_commits=3)
    assert [c.summary for c in first] == ["c3", "c4", "c5"] and len(walks) == 1
    # Each page asks again: the same two commits are not walked again, by name or by id.
    assert commits_ahead(repo, "main", "topic", max_commits=3) == first
    assert commits_ahead(repo, "main", first[-1].sha, max_commits=3) == first
    assert len(walks) == 1
    # The head moved: a new pair, walked.
    head = repo.references["refs/heads/topic"].peel(pygit2.Commit)
    sig = pygit2.Signature("T", "t@example.com")
    repo.create_commit("refs/heads/topic", sig, sig, "c6", head.tree_id, [head.id])
    assert [c.summary for c in commits_ahead(repo, "main", "topic", max_commits=3)] == ["c4", "c5", "c6"]
    assert len(walks) == 2
