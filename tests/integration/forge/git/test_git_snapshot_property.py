"""The snapshot's first promise, as a property: random base trees (symlinks in and out, executables,
big files, submodule links, odd names), random agent changes (writes, deletes, mode changes,
symlinks, refused names), then the task branch differs from its base by exactly the agent's
accepted changes, every refusal is one the rules call for, and `git fsck --strict` passes."""

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pygit2
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from forge.git.checkout import checkout
from forge.git.overlay import SnapshotLimits
from forge.git.pathcheck import escapes, shown
from forge.git.schemas import Identity
from forge.git.snapshot import snapshot
from tests.support.git import BLOB, EXEC, GITLINK, LINK, Leaf, commit_tree, fsck_strict, tree_entries, work_leaves

LIMIT = 64
DIRS = ["", "d/", "d/e/", "s p/"]
NAMES = ["a", "b.txt", "run.sh", "ü.md", "x\\y", "big.bin", "l1"]
PATHS = [d + n for d in DIRS for n in NAMES]
INSIDE = ["a", "../a", "d/e/b.txt", "e", "l1"]
OUTSIDE = ["/etc/passwd", "../../../../x", "d/../../x"]
BAD_NAMES = [".GIT", ".Git", "git~1", "GIT~1", ".git ", ".git.", ".g\u200cit", ".git::$INDEX_ALLOCATION", "n\\ew"]
BAD_BYTES = b"bad\xff\xfe"
ANA = Identity(name="Ana", email="ana@example.com")

small = st.binary(max_size=LIMIT)
big = st.binary(min_size=LIMIT + 1, max_size=LIMIT * 3)
leaf = st.one_of(
    st.tuples(st.sampled_from([BLOB, EXEC]), st.one_of(small, big)),
    st.tuples(st.just(LINK), st.sampled_from(INSIDE + OUTSIDE).map(str.encode)),
    st.tuples(st.just(GITLINK), st.binary(min_size=20, max_size=20).filter(any).map(lambda b: b.hex().encode())),
)
op = st.one_of(
    st.tuples(
        st.just("write"), st.sampled_from([*PATHS, "new.txt", "n/deep.txt"]), st.one_of(small, big), st.booleans()
    ),
    st.tuples(st.just("delete"), st.sampled_from([*PATHS, "d", "d/e"])),
    st.tuples(st.just("chmod"), st.sampled_from(PATHS)),
    st.tuples(st.just("link"), st.sampled_from([*PATHS, "new-link"]), st.sampled_from(INSIDE + OUTSIDE)),
    st.tuples(st.just("bad"), st.sampled_from(DIRS), st.sampled_from([*BAD_NAMES, ""]), st.booleans()),
    st.tuples(
        st.just("gitmodules"), st.sampled_from(["", "d/"]), st.sampled_from(["-oProxyCommand=x", "https://e.x/r"])
    ),
    st.tuples(st.just("dir-to-file"), st.sampled_from(["d", "d/e", "s p"])),
)


def _apply(ws: Path, ops: list[tuple[Any, ...]]) -> None:
    for kind, *args in ops:
        with contextlib.suppress(OSError):
            if kind == "write":
                path, data, exe = args
                (ws / path).parent.mkdir(parents=True, exist_ok=True)
                with contextlib.suppress(FileNotFoundError):
                    (ws / path).unlink()
                (ws / path).write_bytes(data)
                (ws / path).chmod(0o755 if exe else 0o644)
            elif kind == "delete":
                target = ws / args[0]
                if target.is_symlink() or target.is_file():
                    target.unlink()
                elif target.is_dir():
                    shutil.rmtree(target)
            elif kind == "chmod":
                target = ws / args[0]
                if target.is_file() and not target.is_symlink():
                    target.chmod(target.stat().st_mode ^ 0o100)
            elif kind == "link":
                path, to = args
                (ws / path).parent.mkdir(parents=True, exist_ok=True)
                if (ws / path).is_symlink() or (ws / path).is_file():
                    (ws / path).unlink()
                (ws / path).symlink_to(to)
            elif kind == "bad":
                where, name, as_dir = args
                parent = os.fsencode(ws / where) if where else os.fsencode(ws)
                os.makedirs(parent, exist_ok=True)
                raw = os.path.join(parent, os.fsencode(name) if name else BAD_BYTES)
                if as_dir:
                    os.makedirs(raw, exist_ok=True)
                    raw = os.path.join(raw, b"inner.txt")
                with open(raw, "wb") as fh:
                    fh.write(b"bad\n")
            elif kind == "gitmodules":
                where, url = args
                (ws / where).mkdir(parents=True, exist_ok=True)
                (ws / where / ".gitmodules").write_text(f'[submodule "m"]\n\tpath = m\n\turl = {url}\n')
            elif kind == "dir-to-file":
                target = ws / args[0]
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                    target.write_bytes(b"was a directory\n")


def _new(path: str, base: dict[str, Any]) -> list[str]:
    """The components of `path` the base does not have (the agent named them)."""
    parts = path.split("/")
    known = {p.rsplit("/", 1)[0] for p in base} | set(base)
    known_dirs = {"/".join(p.split("/")[:i]) for p in known for i in range(1, len(p.split("/")) + 1)}
    return [parts[i] for i in range(len(parts)) if "/".join(parts[: i + 1]) not in known_dirs]


def _bad_name(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return True
    return name in BAD_NAMES or "\\" in name or name.casefold() == ".git"


def _direct_escape(path: str, target: str) -> bool:
    if target.startswith("/"):
        return True
    depth = path.count("/")
    for part in target.split("/"):
        depth += -1 if part == ".." else (0 if part in ("", ".") else 1)
        if depth < 0:
            return True
    return False


def _inside(root: Path, path: str) -> bool:
    real = os.path.realpath(os.path.join(os.fsencode(root), os.fsencode(path)))
    return real == os.fsencode(root.resolve()) or real.startswith(os.fsencode(root.resolve()) + b"/")


def _check(tmp: Path, base_leaves: dict[str, Leaf], ops: list[tuple[Any, ...]]) -> None:
    repo_path = tmp / "r.git"
    repo = pygit2.init_repository(str(repo_path), bare=True)
    base_sha = commit_tree(repo, base_leaves)
    ws = tmp / "ws"
    ws.mkdir()
    co = checkout(repo, base_sha, ws)
    _apply(ws, ops)
    limits = SnapshotLimits(max_file_bytes=LIMIT)
    snap = snapshot(
        repo,
        ws,
        branch="agent/1",
        parent_sha=base_sha,
        message="m",
        author=ANA,
        committer=ANA,
        limits=limits,
        manifest=co,
    )
    base = tree_entries(repo, base_sha)
    final = tree_entries(repo, snap.sha)
    work = work_leaves(ws)
    gitlinks = {p for p, (m, _) in base.items() if m == GITLINK}
    # Skipped paths are reported as people read them (a name that is not UTF-8 escaped, `bad\\xff`):
    # mapped back to the names on disk to compare.
    names = {"/".join(q.split("/")[:i]) for q in set(work) | set(base) for i in range(1, q.count("/") + 2)}
    raw_of = {shown(n): n for n in names}
    skipped = {raw_of.get(s.path, s.path): s.reason for s in snap.skipped}
    final_links = {p: os.fsdecode(repo[oid].peel(pygit2.Blob).data) for p, (m, oid) in final.items() if m == LINK}

    def refused(path: str) -> bool:
        parts = path.split("/")
        return any("/".join(parts[:i]) in skipped for i in range(1, len(parts) + 1))

    for path in set(base) | set(work) | set(final):
        if refused(path) or path in gitlinks:
            assert final.get(path) == base.get(path), (path, skipped)
        elif path not in work:
            assert path not in final, path
        else:
            mode, content = work[path]
            assert path in final, (path, skipped)
            assert final[path][0] == mode or (final[path] == base.get(path)), path
            assert repo[final[path][1]].peel(pygit2.Blob).data == content, path
    # every refusal is called for
    for path, reason in skipped.items():
        leaf_of = work.get(path)
        under_gitlink = any(path == g or path.startswith(g + "/") or g.startswith(path + "/") for g in gitlinks)
        why = [
            under_gitlink,
            any(_bad_name(n) for n in _new(path, base)),
            leaf_of is not None and leaf_of[0] == LINK and (not _inside(ws, path) or path.endswith(".gitmodules")),
            # through the links the snapshot keeps (a refused change keeps the base's link there)
            leaf_of is not None
            and leaf_of[0] == LINK
            and escapes(path, {**final_links, path: os.fsdecode(leaf_of[1])})[0],
            leaf_of is not None and leaf_of[0] != LINK and len(leaf_of[1]) > LIMIT,
            path.endswith(".gitmodules") and leaf_of is not None and b"url = -" in leaf_of[1],
        ]
        assert any(why), (path, reason)
    # and every change the rules refuse is refused
    for path, (mode, content) in work.items():
        old = base.get(path)
        unchanged = old is not None and old[0] != GITLINK and repo[old[1]].peel(pygit2.Blob).data == content
        must = any(_bad_name(n) for n in _new(path, base)) or path in gitlinks
        if mode == LINK and not unchanged:
            must = must or _direct_escape(path, os.fsdecode(content)) or path.endswith(".gitmodules")
        elif not unchanged:
            must = must or len(content) > LIMIT or (path.endswith(".gitmodules") and b"url = -" in content)
        if must:
            assert refused(path), (path, skipped)
    # the agent's new symlinks resolve inside, checked on a real checkout of the snapshot
    out = tmp / "out"
    out.mkdir()
    checkout(repo, snap.sha, out)
    for path, (mode, oid) in final.items():
        if mode == LINK and base.get(path) != (mode, oid):
            assert _inside(out, path), path
    assert sorted(p for p in set(base) | set(final) if base.get(p) != final.get(p)) == snap.changed_files
    fsck = fsck_strict(repo_path)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Found by this property: a new link at a path whose base link escaped was let escape too (the
# exemption for the base's own escaping links went by path); and a refused change keeps the
# base's link, through which another new link may then escape.
@example(base={"a": (LINK, b"../a"), "b.txt": (LINK, b"a")}, many=0, ops=[("link", "b.txt", "../a")])
@example(base={"a": (LINK, b"../a"), "s p/ü.md": (LINK, b"../../../../x")}, many=0, ops=[("link", "s p/ü.md", "../a")])
@example(
    base={"a": (LINK, b"../a"), "b.txt": (BLOB, b"")},
    many=0,
    ops=[("write", "a", b"\0" * 65, False), ("link", "b.txt", "a")],
)
@given(
    base=st.dictionaries(st.sampled_from(PATHS), leaf, max_size=14),
    many=st.integers(min_value=0, max_value=300),
    ops=st.lists(op, max_size=10),
)
def test_snapshot_differs_from_its_base_by_exactly_the_accepted_changes(
    base: dict[str, Leaf], many: int, ops: list[Any]
) -> None:
    base = {**base, **{f"many/f{i}": (BLOB, b"%d\n" % i) for i in range(many)}}
    # tmpfs when there is one: each example writes two checkouts, and file creation dominates
    with tempfile.TemporaryDirectory(dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        _check(Path(tmp), base, ops)
