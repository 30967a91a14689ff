"""Validation of owner, repository, ref and tree path names, and traversal-proof repository paths.

Repository directories are ``<root>/<owner>/<name>.git`` with both parts lower-cased: names are
unique case-insensitively (as on GitHub), and a case-insensitive file system cannot mix two
repositories up.
"""

from __future__ import annotations

import re
from pathlib import Path

import pygit2

from forge.git.errors import InvalidName, InvalidPath, InvalidRefName

OWNER_MAX_LENGTH = 64
REPO_MAX_LENGTH = 100
TREE_PATH_MAX_LENGTH = 4096
REF_MAX_LENGTH = 255

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+", re.ASCII)

#: First path segments the web application keeps for itself: an account may not be called so.
RESERVED_OWNER_NAMES: frozenset[str] = frozenset(
    {
        "about", "account", "accounts", "admin", "api", "assets", "auth", "dashboard", "docs",
        "explore", "favicon.ico", "forgehand", "git", "health", "healthz", "help", "hooks",
        "login", "logout", "metrics", "new", "notifications", "oauth", "org", "orgs", "readyz",
        "register", "repos", "robots.txt", "search", "settings", "signin", "signout", "signup",
        "site", "sse", "static", "system", "tasks", "token", "tokens", "user", "users",
        "webhooks", "well-known",
    }
)  # fmt: skip

#: Second path segments (``/{owner}/...``) that cannot be repository names.
RESERVED_REPO_NAMES: frozenset[str] = frozenset({"settings", "repos", "tasks", "tokens"})


def _validate_name(kind: str, value: str, max_length: int, reserved: frozenset[str]) -> str:
    if not isinstance(value, str):
        raise InvalidName(f"{kind} name must be a string")
    if not value:
        raise InvalidName(f"{kind} name must not be empty")
    if len(value) > max_length:
        raise InvalidName(f"{kind} name is longer than {max_length} characters")
    if not _NAME_RE.fullmatch(value):
        raise InvalidName(f"{kind} name may only contain ASCII letters, digits, '.', '_' and '-'")
    if value[0] in ".-":
        raise InvalidName(f"{kind} name must not start with '.' or '-'")
    if value[-1] == ".":
        raise InvalidName(f"{kind} name must not end with '.'")
    if ".." in value:
        raise InvalidName(f"{kind} name must not contain '..'")
    lowered = value.lower()
    if lowered.endswith(".git"):
        raise InvalidName(f"{kind} name must not end with '.git'")
    if lowered in reserved:
        raise InvalidName(f"{kind} name '{value}' is reserved")
    return value


def validate_owner_name(name: str, *, reserved: frozenset[str] = RESERVED_OWNER_NAMES) -> str:
    """Return ``name`` if it is an acceptable account (owner) name, else raise ``InvalidName``."""
    return _validate_name("owner", name, OWNER_MAX_LENGTH, reserved)


def validate_repo_name(name: str, *, reserved: frozenset[str] = RESERVED_REPO_NAMES) -> str:
    """Return ``name`` if it is an acceptable repository name, else raise ``InvalidName``."""
    return _validate_name("repository", name, REPO_MAX_LENGTH, reserved)


def repo_path(root: Path, owner: str, name: str) -> Path:
    """The bare repository directory of ``owner/name`` under ``root``.

    Validates both names, joins, and checks that the result is a direct grandchild of ``root``:
    no input can name a directory elsewhere.
    """
    validate_owner_name(owner)
    validate_repo_name(name)
    base = Path(root).resolve()
    path = base / owner.lower() / f"{name.lower()}.git"
    # The names cannot contain separators or '..', but check anyway: this is the last gate.
    if path.parent.parent != base or not path.is_relative_to(base):
        raise InvalidName(f"repository path escapes the repository root: {owner}/{name}")
    return path


def owner_path(root: Path, owner: str) -> Path:
    """The directory holding every repository of ``owner``."""
    validate_owner_name(owner)
    base = Path(root).resolve()
    path = base / owner.lower()
    if path.parent != base:
        raise InvalidName(f"owner path escapes the repository root: {owner}")
    return path


# --- refs -----------------------------------------------------------------------------------------


def validate_ref_name(ref: str) -> str:
    """Return ``ref`` if it is a valid full ref name under ``refs/`` (git check-ref-format rules)."""
    if not isinstance(ref, str) or not ref:
        raise InvalidRefName("ref name must not be empty")
    if len(ref) > REF_MAX_LENGTH:
        raise InvalidRefName(f"ref name is longer than {REF_MAX_LENGTH} characters")
    if not ref.startswith("refs/"):
        raise InvalidRefName(f"ref name must start with 'refs/': {ref!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in ref) or not ref.isprintable():
        raise InvalidRefName("ref name must not contain control characters")
    if not pygit2.reference_is_valid_name(ref):
        raise InvalidRefName(f"invalid ref name: {ref!r}")
    return ref


def validate_branch_name(name: str) -> str:
    """Return ``name`` if ``refs/heads/<name>`` is a valid branch ref (and not ``HEAD``)."""
    if not isinstance(name, str) or not name:
        raise InvalidRefName("branch name must not be empty")
    if name == "HEAD" or name.startswith(("-", "refs/")):
        raise InvalidRefName(f"invalid branch name: {name!r}")
    validate_ref_name(f"refs/heads/{name}")
    return name


def validate_tag_name(name: str) -> str:
    """Return ``name`` if ``refs/tags/<name>`` is a valid tag ref."""
    if not isinstance(name, str) or not name or name.startswith("-"):
        raise InvalidRefName(f"invalid tag name: {name!r}")
    validate_ref_name(f"refs/tags/{name}")
    return name


def is_valid_ref_name(ref: str) -> bool:
    try:
        validate_ref_name(ref)
    except InvalidRefName:
        return False
    return True


def confusing_ref_name(ref: str) -> str | None:
    """Why a valid ref still must not be pushed: a branch or tag called ``HEAD`` (in any case;
    ``git branch HEAD`` refuses it, and clients read ``refs/heads/HEAD`` as the symbolic ref), or
    one whose name starts with ``-`` (an option to every git command that is given it)."""
    for namespace in ("refs/heads/", "refs/tags/"):
        if ref.startswith(namespace):
            short = ref.removeprefix(namespace)
            if short.casefold() == "head":
                return f"{short!r} is not a branch or tag name"
            if short.startswith("-"):
                return "branch and tag names must not start with '-'"
    return None


# --- tree paths -----------------------------------------------------------------------------------

_DOT_GIT_LIKE = re.compile(r"\.git[. ]*|git~\d+", re.IGNORECASE)


def validate_tree_path(path: str) -> str:
    """Return the canonical form of a path inside a tree; ``""`` is the root.

    Refused: absolute paths, backslashes, NUL and other control characters, empty, ``.`` and
    ``..`` components and ``.git`` components (with the spellings that some file systems fold to
    ``.git``). One trailing slash is accepted and dropped.
    """
    if not isinstance(path, str):
        raise InvalidPath("path must be a string")
    if path in ("", "/"):
        return ""
    if len(path) > TREE_PATH_MAX_LENGTH:
        raise InvalidPath(f"path is longer than {TREE_PATH_MAX_LENGTH} characters")
    if path.startswith("/"):
        raise InvalidPath("path must be relative (no leading '/')")
    if "\\" in path:
        raise InvalidPath("path must not contain backslashes")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise InvalidPath("path must not contain NUL or control characters")
    if path.endswith("/"):
        path = path[:-1]
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise InvalidPath(f"path has an empty, '.' or '..' component: {path!r}")
        if _DOT_GIT_LIKE.fullmatch(part):
            raise InvalidPath(f"path has a '.git' component: {path!r}")
    return path
