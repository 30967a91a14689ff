"""Git test pieces: trees built byte for byte (names libgit2 would refuse included), the leaves of a
tree or a work tree, and `git fsck --strict` with the real CLI."""

import os
import stat
import subprocess
from pathlib import Path

import pygit2
from pygit2.enums import FileMode, ObjectType

TREE, BLOB, EXEC, LINK, GITLINK = 0o040000, 0o100644, 0o100755, 0o120000, 0o160000

# A leaf as the tests describe it: (mode, content) with content the blob's bytes (a symlink's
# target) or, for a submodule link, the commit id in hex.
Leaf = tuple[int, bytes]


def write_tree(repo: pygit2.Repository, leaves: dict[str, Leaf]) -> pygit2.Oid:
    """A tree holding `leaves` (paths with `/`), serialized by hand so that any name goes in."""
    children: dict[str, dict[str, Leaf]] = {}
    entries: dict[bytes, tuple[int, pygit2.Oid]] = {}
    for path, (mode, content) in leaves.items():
        head, sep, rest = path.partition("/")
        if sep:
            children.setdefault(head, {})[rest] = (mode, content)
        elif mode == GITLINK:
            entries[os.fsencode(head)] = (mode, pygit2.Oid(hex=content.decode()))
        else:
            entries[os.fsencode(head)] = (mode, repo.create_blob(content))
    for name, sub in children.items():
        entries[os.fsencode(name)] = (TREE, write_tree(repo, sub))

    def order(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == TREE else name

    raw = b"".join(b"%o %s\x00%s" % (entries[n][0], n, entries[n][1].raw) for n in sorted(entries, key=order))
    return repo.odb.write(ObjectType.TREE, raw)


def commit_tree(repo: pygit2.Repository, leaves: dict[str, Leaf], branch: str = "main") -> str:
    sig = pygit2.Signature("Ana", "ana@example.com", 1_700_000_000, 0)
    oid = repo.create_commit(f"refs/heads/{branch}", sig, sig, "base", write_tree(repo, leaves), [])
    return str(oid)


def fast_import(repo_path: Path, files: dict[str, bytes], branch: str = "main") -> str:
    """One commit holding `files`, written as a pack by `git fast-import` (many files, quickly)."""
    out = [b"commit refs/heads/%s\ncommitter Ana <ana@example.com> 1700000000 +0000\ndata 4\nbase\n" % branch.encode()]
    for path, data in files.items():
        out.append(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))
    subprocess.run(
        ["git", f"--git-dir={repo_path}", "fast-import", "--quiet"], input=b"".join(out), check=True, timeout=300
    )
    return subprocess.run(
        ["git", f"--git-dir={repo_path}", "rev-parse", branch], capture_output=True, text=True, check=True
    ).stdout.strip()


def tree_entries(repo: pygit2.Repository, sha: str) -> dict[str, tuple[int, pygit2.Oid]]:
    """Every non-tree entry of the commit's tree: path -> (mode, id)."""
    out: dict[str, tuple[int, pygit2.Oid]] = {}

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            path = prefix + os.fsdecode(entry.raw_name or b"")
            if entry.filemode == FileMode.TREE:
                walk(repo[entry.id].peel(pygit2.Tree), path + "/")
            else:
                out[path] = (int(entry.filemode), entry.id)

    walk(repo[sha].peel(pygit2.Commit).tree, "")
    return out


def work_leaves(root: Path) -> dict[str, Leaf]:
    """The files and symlinks of a work tree: path -> (mode as git would record it, content)."""
    out: dict[str, Leaf] = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        rel = os.path.relpath(dirpath, os.fsencode(root))
        for name in [*filenames, *[d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]]:
            full = os.path.join(dirpath, name)
            path = os.fsdecode(name if rel == b"." else os.path.join(rel, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[path] = (LINK, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as fh:
                    out[path] = (EXEC if st.st_mode & 0o100 else BLOB, fh.read())
    return out


def fsck_strict(repo_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", f"--git-dir={repo_path}", "fsck", "--strict", "--no-dangling", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
