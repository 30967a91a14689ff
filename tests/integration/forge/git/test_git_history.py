"""Last commits per entry, path history and blame on a real repository written with the git CLI
and pushed with `git push`; git's own `log -- path` is the oracle."""

from pathlib import Path

import pygit2
import pytest

from forge.git import bare
from forge.git.blame import blame_file
from forge.git.browse import ref_names
from forge.git.errors import NotABlob, PathNotFound, RefNotFound
from forge.git.history import last_commits, path_history, tree_page
from forge.git.names import repo_path
from tests.support.browse_repo import History, build_history, last_change, path_log, push_to


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple[History, Path]:
    root = tmp_path_factory.mktemp("history")
    history = build_history(root / "work")
    path = repo_path(root / "repos", "ana", "proj")
    bare.init_repo(path)
    push_to(history.work, path)
    return history, path


@pytest.fixture
def repo(world: tuple[History, Path]) -> pygit2.Repository:
    return bare.open_repo(world[1])


def test_last_commit_of_each_entry_matches_git_log(world: tuple[History, Path], repo: pygit2.Repository) -> None:
    history, _ = world
    for folder in ("", "src", "docs", "src/lib"):
        page = tree_page(repo, None, folder)
        assert page.last.complete
        assert {e.name for e in page.listing.entries} == set(page.last.commits)
        for entry in page.listing.entries:
            assert page.last.commits[entry.name].sha == last_change(history.work, entry.path), entry.path
    root = tree_page(repo, None, "").last.commits
    # the merge took src/ unchanged from the feature branch: the feature commit is named, not the merge
    assert root["src"].sha == history.feature and root["src"].summary == "Greet the world"
    assert root["LICENSE"].sha == history.initial
    assert root["docs"].sha == history.docs_added


def test_last_commits_at_another_ref_and_the_walk_cap(world: tuple[History, Path], repo: pygit2.Repository) -> None:
    history, _ = world
    at_tag = tree_page(repo, "v1.0", "")
    assert {e.name for e in at_tag.listing.entries} == {"README.md", "LICENSE", "src", "docs"}
    assert at_tag.last.commits["src"].sha == history.app_changed
    capped = last_commits(repo, None, "", ["LICENSE", "assets", "src"], max_walk=2)
    assert not capped.complete and capped.walked == 2
    assert set(capped.commits) == {"assets"}  # LICENSE and src changed before the two newest commits


def test_folder_readme_is_found(repo: pygit2.Repository) -> None:
    page = tree_page(repo, None, "docs")
    assert page.readme is not None and page.readme.path == "docs/README.md"
    assert page.readme.text is not None and "The docs folder" in page.readme.text
    assert tree_page(repo, None, "src").readme is None


def test_path_history_matches_git_log(world: tuple[History, Path], repo: pygit2.Repository) -> None:
    history, _ = world
    for path in ("src/app.py", "src", "docs/guide.md", "LICENSE"):
        got = path_history(repo, None, path, per_page=100)
        assert [c.sha for c in got.commits] == path_log(history.work, path), path
        assert not got.truncated
    first = path_history(repo, None, "src/app.py", per_page=2)
    assert first.has_next and [c.sha for c in first.commits] == [history.feature, history.app_changed]
    second = path_history(repo, None, "src/app.py", page=2, per_page=2)
    assert [c.sha for c in second.commits] == [history.initial] and not second.has_next
    capped = path_history(repo, None, "LICENSE", max_walk=3)
    assert capped.truncated and capped.commits == []
    with pytest.raises(PathNotFound):
        path_history(repo, None, "no/such/file")
    with pytest.raises(RefNotFound):
        path_history(repo, "no-such-branch", "LICENSE")


def test_blame_names_the_commit_of_each_line(world: tuple[History, Path], repo: pygit2.Repository) -> None:
    history, _ = world
    found = blame_file(repo, None, "src/app.py")
    assert found.refused is None
    assert found.lines[1] == '    return "hello, world"'
    by_line: dict[int, str] = {}
    for hunk in found.hunks:
        for n in range(hunk.start, hunk.start + hunk.count):
            by_line[n] = hunk.commit.sha
    assert sorted(by_line) == list(range(1, len(found.lines) + 1))
    assert by_line[2] == history.feature
    assert {by_line[n] for n in (1, 3, 4, 5)} == {history.initial}
    # at the tag, line 2 is Bob's "hello" commit
    old = blame_file(repo, "v1.0", "src/app.py")
    assert next(h for h in old.hunks if h.start <= 2 < h.start + h.count).commit.sha == history.app_changed


def test_blame_refuses_binary_huge_and_long_files(repo: pygit2.Repository) -> None:
    assert blame_file(repo, None, "assets/logo.bin").refused == "binary"
    huge = blame_file(repo, None, "assets/huge.txt")
    assert huge.refused == "too_large" and huge.lines == [] and huge.size > 1024 * 1024
    assert blame_file(repo, None, "src/app.py", max_lines=3).refused == "too_many_lines"
    with pytest.raises(NotABlob):
        blame_file(repo, None, "src")
    with pytest.raises(PathNotFound):
        blame_file(repo, None, "src/nope.py")
    with pytest.raises(RefNotFound):
        blame_file(repo, "nope", "src/app.py")


def test_ref_names_for_the_switcher(repo: pygit2.Repository) -> None:
    names = ref_names(repo)
    assert names.branches == ["main", "feature/x"]  # the default first
    assert names.tags == ["v1.0"]
