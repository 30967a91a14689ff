from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.git.errors import InvalidName, InvalidPath, InvalidRefName
from forge.git.names import (
    owner_path,
    repo_path,
    validate_branch_name,
    validate_owner_name,
    validate_ref_name,
    validate_repo_name,
    validate_tree_path,
)

GOOD_NAMES = ["forgehand", "a", "A-b_c.d", "x1", "my.repo", "repo-", "a_", "9lives", "x" * 100]
BAD_NAMES = [
    "",
    ".",
    "..",
    ".hidden",
    "-flag",
    "a/b",
    "a\\b",
    "../etc",
    "a..b",
    "repo.git",
    "repo.GIT",
    "trailing.",
    "sp ace",
    "tab\t",
    "new\nline",
    "nul\0",
    "ünïcode",
    "a:b",
    "a%2fb",
    "x" * 101,
    "settings",
    "~user",
    "a*",
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_repo_names(name: str) -> None:
    assert validate_repo_name(name) == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_repo_names(name: str) -> None:
    with pytest.raises(InvalidName):
        validate_repo_name(name)


@pytest.mark.parametrize("name", ["api", "static", "login", "API", "Settings", "admin", "favicon.ico"])
def test_reserved_owner_names(name: str) -> None:
    with pytest.raises(InvalidName, match="reserved"):
        validate_owner_name(name)


def test_invalid_name_is_a_value_error_with_a_clear_message() -> None:
    with pytest.raises(ValueError, match=r"must not start with '\.' or '-'"):
        validate_owner_name("-rf")
    with pytest.raises(InvalidName, match=r"must not end with '\.git'"):
        validate_repo_name("x.git")


def test_repo_path_is_under_root_and_lowercased(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "Alice", "My.Repo")
    assert path == tmp_path.resolve() / "alice" / "my.repo.git"
    assert owner_path(tmp_path, "Alice") == tmp_path.resolve() / "alice"


@pytest.mark.parametrize(("owner", "name"), [("..", "x"), ("a", ".."), ("a/b", "c"), ("a", "/etc"), ("", "x")])
def test_repo_path_refuses_traversal(tmp_path: Path, owner: str, name: str) -> None:
    with pytest.raises(InvalidName):
        repo_path(tmp_path, owner, name)


@given(owner=st.text(max_size=80), name=st.text(max_size=120))
def test_repo_path_never_escapes(owner: str, name: str) -> None:
    root = Path("/srv/forgehand/repos")
    try:
        path = repo_path(root, owner, name)
    except InvalidName:
        return
    assert path.parent.parent == root
    assert path.name.endswith(".git")
    assert ".." not in path.parts
    assert not path.parent.name.startswith((".", "-"))


@given(st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True))
def test_simple_names_are_accepted(name: str) -> None:
    if name.lower() in {"settings", "repos", "tasks", "tokens"}:
        return
    assert validate_repo_name(name) == name


@pytest.mark.parametrize("ref", ["refs/heads/main", "refs/heads/feature/x", "refs/tags/v1.0", "refs/heads/agent/t-1"])
def test_good_refs(ref: str) -> None:
    assert validate_ref_name(ref) == ref


@pytest.mark.parametrize(
    "ref",
    [
        "",
        "main",
        "HEAD",
        "refs/heads/a..b",
        "refs/heads/a.lock",
        "refs/heads/a b",
        "refs/heads/a~1",
        "refs/heads/a^",
        "refs/heads/a:b",
        "refs/heads/a?",
        "refs/heads/a*",
        "refs/heads/a[",
        "refs/heads/a\\b",
        "refs/heads/",
        "refs/heads//x",
        "refs/heads/x/",
        "refs/heads/.x",
        "refs/heads/x@{1}",
        "refs/heads/x\0",
        "refs/heads/x\n",
        "refs/heads/" + "x" * 300,
    ],
)
def test_bad_refs(ref: str) -> None:
    with pytest.raises(InvalidRefName):
        validate_ref_name(ref)


@pytest.mark.parametrize("name", ["HEAD", "-x", "refs/heads/main", "a..b", ""])
def test_bad_branch_names(name: str) -> None:
    with pytest.raises(InvalidRefName):
        validate_branch_name(name)


@pytest.mark.parametrize(
    ("path", "expected"),
    [("", ""), ("/", ""), ("a", "a"), ("a/b.txt", "a/b.txt"), ("dir/", "dir"), ("a/.gitignore", "a/.gitignore")],
)
def test_good_tree_paths(path: str, expected: str) -> None:
    assert validate_tree_path(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "..",
        "a/../b",
        "./a",
        "a/./b",
        "/etc/passwd",
        "a//b",
        "a\0b",
        "a\nb",
        ".git",
        "a/.git/config",
        ".GIT/x",
        ".git./x",
        "git~1/x",
        "a\\b",
        "x" * 5000,
    ],
)
def test_bad_tree_paths(path: str) -> None:
    with pytest.raises(InvalidPath):
        validate_tree_path(path)


@given(st.text(max_size=200))
def test_tree_paths_never_traverse(path: str) -> None:
    try:
        norm = validate_tree_path(path)
    except InvalidPath:
        return
    parts = norm.split("/") if norm else []
    assert ".." not in parts and "." not in parts and "" not in parts
    assert not norm.startswith("/")
    assert "\0" not in norm
    assert all(p.lower() != ".git" for p in parts)
