"""What a tree may hold when its content comes from an untrusted work tree: the names, symlinks and
`.gitmodules` that git itself (`git fsck --strict`, checkout on Windows and macOS) treats as
dangerous. Pure functions, no I/O besides parsing a `.gitmodules` blob.

Each check returns a reason (for people) or None. They are stricter than git where being exact
would take a lot of code: a refused agent change is reported and the base's version kept."""

import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pygit2

# Code points HFS+ ignores when it compares names (git's `is_hfs_dotgit`): `.g\u200cit` is `.git`.
_HFS_IGNORED = dict.fromkeys(
    map(ord, "\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u206a\u206b\u206c\u206d\u206e\u206f\ufeff")
)
# The dot files git guards, with their NTFS 8.3 short names (`git~1`, `gitmod~1`, the hashed forms).
_GUARDED = {
    ".git": ("git~",),
    ".gitmodules": ("gitmod~", "gi7eba~"),
    ".gitattributes": ("gitatt~", "gi7d29~"),
    ".gitignore": ("gitign~", "gi250a~"),
    ".mailmap": ("mailma~", "maba30~"),
}
_SHORT = re.compile(r"^(.{1,6}~)[1-9][0-9]*$")
MAX_LINK_HOPS = 40
GITATTRIBUTES_MAX_LINE = 2048


def folded(name: str) -> str:
    """`name` as NTFS and HFS+ compare it: case folded, ignorable code points dropped, an NTFS
    alternate data stream (`::$INDEX_ALLOCATION`) and trailing spaces and dots cut."""
    out = name.translate(_HFS_IGNORED).casefold()
    out = out.split(":", 1)[0]
    return out.rstrip(" .")


def guarded_as(name: str) -> str | None:
    """Which guarded dot file (`.git`, `.gitmodules`, ...) some file system reads `name` as."""
    f = folded(name)
    for dotfile, shorts in _GUARDED.items():
        if f == dotfile:
            return dotfile
        m = _SHORT.match(f)
        if m and m.group(1) in shorts:
            return dotfile
    return None


def shown(path: str) -> str:
    """A path as people, JSON and the database can take it. A name that is not UTF-8 comes from
    `os.fsdecode` with its bad bytes as lone surrogates, which no UTF-8 encoder accepts: those
    bytes are written as `\\xff` escapes (`bad\\xffname`)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:
            return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return path


def name_problem(name: str) -> str | None:
    """Why a file name the agent introduced cannot go into a tree."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "the file name is not valid UTF-8"
    if name in ("", ".", "..") or "/" in name or "\x00" in name:
        return "invalid file name"
    if "\\" in name:
        return "a backslash in the file name (a path separator on Windows)"
    if guarded_as(name) == ".git":
        return "git metadata is never taken from the sandbox" if name == ".git" else f"a spelling of .git ({name!r})"
    return None


def link_problem(name: str, target: str) -> str | None:
    """Why a symlink the agent wrote cannot go into a tree (its chain is checked by `escapes`)."""
    if guarded_as(name) is not None:
        return f"{guarded_as(name)} may not be a symlink"
    if not target or "\x00" in target:
        return "invalid symlink target"
    try:
        target.encode("utf-8")
    except UnicodeEncodeError:
        return "the symlink target is not valid UTF-8"
    if target.startswith("/"):
        return f"symlink points outside the work tree ({target})"
    return None


def escapes(path: str, links: Mapping[str, str]) -> tuple[bool, set[str]]:
    """Whether the symlink at `path` resolves outside the tree, following every symlink of the
    final tree (`links`: path -> target) on the way, lexically. Also returns the links it went
    through (`path` included), so that the caller knows whom to blame."""
    stack = path.split("/")[:-1]
    pending = links[path].split("/")
    seen = {path}
    hops = 0
    while pending:
        part = pending.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            if not stack:
                return True, seen
            stack.pop()
            continue
        stack.append(part)
        here = "/".join(stack)
        target = links.get(here)
        if target is None:
            continue
        seen.add(here)
        hops += 1
        if target.startswith("/"):
            return True, seen
        if hops > MAX_LINK_HOPS:
            return False, seen  # a loop resolves nowhere, so not outside either
        stack.pop()
        pending = target.split("/") + pending
    return False, seen


def gitmodules_problem(data: bytes) -> str | None:
    """Why a `.gitmodules` blob would be refused by `git fsck` (or could inject options into a
    later `git submodule`): unparsable, a URL or path starting with `-`, an `update = !command`,
    a submodule name that climbs out (`..`)."""
    fd, tmp = tempfile.mkstemp(prefix="forgehand-gitmodules-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        try:
            entries = [(e.name, e.value or "") for e in pygit2.Config(tmp)]
        except (pygit2.GitError, ValueError, UnicodeDecodeError):
            return ".gitmodules does not parse"
    finally:
        Path(tmp).unlink()
    for key, value in entries:
        section, _, rest = key.partition(".")
        if section.lower() != "submodule" or "." not in rest:
            continue
        sub, _, var = rest.rpartition(".")
        var = var.lower()
        if ".." in re.split(r"[/\\]", sub) or sub.startswith("-"):
            return f".gitmodules: unsafe submodule name {sub!r}"
        if var in ("url", "path") and (value.startswith("-") or "\n" in value):
            return f".gitmodules: submodule {sub!r} {var} starts with '-' (option injection)"
        if var == "update" and value.startswith("!"):
            return f".gitmodules: submodule {sub!r} runs a command on update"
    return None


def blob_problem(name: str, data: bytes) -> str | None:
    """Content checks git applies to the guarded dot files."""
    kind = guarded_as(name)
    if kind == ".gitmodules":
        return gitmodules_problem(data)
    if kind == ".gitattributes" and any(len(line) > GITATTRIBUTES_MAX_LINE for line in data.split(b"\n")):
        return f".gitattributes has a line over {GITATTRIBUTES_MAX_LINE} bytes"
    return None
