"""Snapshot regressions, one per way a task branch used to lose or change what the agent never
touched, and per refusal the rules call for (see the property test beside this file)."""

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pygit2
import pytest

from forge.git import checkout as git_checkout
from forge.git.checkout import checkout
from forge.git.overlay import SnapshotLimits, SnapshotTooLarge
from forge.git.schemas import Identity
from forge.git.snapshot import Snapshot, snapshot
from tests.support.git import BLOB, EXEC, GITLINK, LINK, Leaf, commit_tree, fast_import, fsck_strict, tree_entries
from tests.support.waiting import until_sync

ANA = Identity(name="Ana", email="ana@example.com")
SUB = b"1234567890abcdef1234567890abcdef12345678"


class Repo:
    def __init__(self, tmp: Path, leaves: dict[str, Leaf], many: dict[str, bytes] | None = None) -> None:
        self.path = tmp / "r.git"
        self.repo = pygit2.init_repository(str(self.path), bare=True)
        self.base = fast_import(self.path, many) if many is not None else commit_tree(self.repo, leaves)
        self.ws = tmp / "ws"
        self.ws.mkdir()
        self.checkout = checkout(self.repo, self.base, self.ws)

    def snap(self, **limits: int) -> Snapshot:
        return snapshot(
            self.repo,
            self.ws,
            branch="agent/1",
            parent_sha=self.base,
            message="m",
            author=ANA,
            committer=ANA,
            limits=SnapshotLimits(**limits),
            manifest=self.checkout,
        )

    def changes(self, snap: Snapshot) -> dict[str, tuple[int, pygit2.Oid] | None]:
        old, new = tree_entries(self.repo, self.base), tree_entries(self.repo, snap.sha)
        return {p: new.get(p) for p in set(old) | set(new) if old.get(p) != new.get(p)}

    def blob(self, snap: Snapshot, path: str) -> bytes:
        data: bytes = self.repo[tree_entries(self.repo, snap.sha)[path][1]].peel(pygit2.Blob).data
        return data


def test_what_the_agent_did_not_touch_keeps_the_base_exactly(tmp_path: Path) -> None:
    base: dict[str, Leaf] = {
        "big.bin": (BLOB, b"x" * 5000),
        "run.sh": (EXEC, b"#!/bin/sh\n"),
        "abs-link": (LINK, b"/etc/passwd"),
        "up-link": (LINK, b"../../outside"),
        "ok-link": (LINK, b"run.sh"),
        "win\\name.txt": (BLOB, b"backslash\n"),
        "vendor/lib": (GITLINK, SUB),
        "src/a.py": (BLOB, b"a\n"),
    }
    r = Repo(tmp_path, base)
    assert not (r.ws / "vendor" / "lib").exists()
    assert {s.path for s in r.checkout.not_written} == {"vendor/lib"}
    (r.ws / "new.txt").write_text("new\n")
    snap = r.snap(max_file_bytes=100)
    assert snap.committed and snap.skipped == []
    assert r.changes(snap) == {"new.txt": (BLOB, pygit2.hash(b"new\n"))}
    assert snap.changed_files == ["new.txt"]
    assert fsck_strict(r.path).returncode == 0


@pytest.fixture
def fast_tmp(tmp_path: Path) -> Iterator[Path]:
    """tmpfs when there is one: creating 60,000 files is what takes time on a disk."""
    if not Path("/dev/shm").is_dir():
        yield tmp_path
        return
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        yield Path(tmp)


def test_a_base_of_60000_files_with_one_change_keeps_all_of_them(fast_tmp: Path) -> None:
    t0 = time.monotonic()
    r = Repo(fast_tmp, {}, many={f"d{i // 500}/f{i}.txt": b"%d\n" % i for i in range(60_000)})
    t1 = time.monotonic()
    (r.ws / "d7" / "f3500.txt").write_text("changed\n")
    snap = r.snap()  # the default caps (50,000 files) apply to the change, not to the base
    t2 = time.monotonic()
    assert r.changes(snap) == {"d7/f3500.txt": (BLOB, pygit2.hash(b"changed\n"))}
    assert len(tree_entries(r.repo, snap.sha)) == 60_000
    print(f"60,000-file base: import and checkout {t1 - t0:.2f} s, snapshot {t2 - t1:.2f} s")
    assert t2 - t1 < 30


def test_a_change_over_the_caps_fails_loudly_and_the_base_does_not_count(tmp_path: Path) -> None:
    r = Repo(tmp_path, {f"f{i}": (BLOB, b"%d" % i) for i in range(50)})
    for i in range(5):
        (r.ws / f"f{i}").write_text("changed")
    assert r.snap(max_files=5).committed  # 50 files in the base, 5 changed: within a 5-file cap
    (r.ws / "one-more").write_text("x")
    with pytest.raises(SnapshotTooLarge):
        r.snap(max_files=5)
    with pytest.raises(SnapshotTooLarge):
        r.snap(max_total_bytes=20)


def test_refused_changes_are_reported_and_keep_the_base(tmp_path: Path) -> None:
    r = Repo(tmp_path, {"big.bin": (BLOB, b"x" * 500), "doc.txt": (BLOB, b"doc\n"), "keep.txt": (BLOB, b"k\n")})
    (r.ws / "big.bin").write_bytes(b"y" * 500)  # over the limit and changed: refused
    (r.ws / "doc.txt").unlink()
    (r.ws / "doc.txt").symlink_to("/etc/passwd")  # replacing a file by an escaping link: refused
    (r.ws / "new-big.bin").write_bytes(b"z" * 500)  # new and over the limit: refused, stays absent
    (r.ws / "keep.txt").unlink()  # an accepted deletion
    snap = r.snap(max_file_bytes=100)
    reasons = {s.path: s.reason for s in snap.skipped}
    assert set(reasons) == {"big.bin", "doc.txt", "new-big.bin"}
    assert "over the 100 byte limit" in reasons["big.bin"] and "outside" in reasons["doc.txt"]
    assert r.changes(snap) == {"keep.txt": None}


def test_one_bad_name_does_not_fail_the_snapshot(tmp_path: Path) -> None:
    r = Repo(tmp_path, {"README": (BLOB, b"r\n")})
    bad = [".GIT", ".Git", "git~1", ".git ", ".git.", ".g\u200cit", ".git::$INDEX_ALLOCATION", "GIT~1", "a\\b"]
    for name in bad:
        (r.ws / name).write_text("bad\n")
    (r.ws / ".git").mkdir()
    (r.ws / ".git" / "config").write_text("[core]\n\thooksPath = /tmp\n")
    os.close(os.open(os.fsencode(r.ws) + b"/bad\xff.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    (r.ws / "good.txt").write_text("good\n")
    snap = r.snap()
    skipped = {s.path for s in snap.skipped}
    assert skipped == {*bad, ".git", "bad\\xff.txt"}  # a name that is not UTF-8 shown with its byte escaped
    assert "bad\\\\xff.txt" in msgspec.json.encode(snap).decode()  # and the report encodes
    assert r.changes(snap) == {"good.txt": (BLOB, pygit2.hash(b"good\n"))}
    assert fsck_strict(r.path).returncode == 0


def test_a_base_name_that_is_not_utf8_is_kept_and_never_breaks_a_report(tmp_path: Path) -> None:
    """A pushed name that is not UTF-8 is not checked out (its manifest entry could not be
    encoded) and is kept from the base; the agent cannot replace it."""
    path = tmp_path / "r.git"
    pygit2.init_repository(str(path), bare=True)
    stream = b"commit refs/heads/main\ncommitter Ana <ana@example.com> 1700000000 +0000\ndata 4\nbase\n"
    for name, data in ((b"caf\xe9.txt", b"latin-1\n"), (b"ok.txt", b"ok\n")):
        stream += b"M 100644 inline %s\ndata %d\n%s\n" % (name, len(data), data)
    subprocess.run(["git", f"--git-dir={path}", "fast-import", "--quiet"], input=stream, check=True, timeout=60)
    repo = pygit2.Repository(str(path))
    base = str(repo.references["refs/heads/main"].target)
    ws = tmp_path / "ws"
    ws.mkdir()
    manifest = checkout(repo, base, ws)
    assert sorted(os.listdir(ws)) == ["ok.txt"]
    assert [(s.path, s.reason) for s in manifest.not_written] == [
        ("caf\\xe9.txt", "a name that is not UTF-8 is not checked out")
    ]
    msgspec.msgpack.encode(manifest)  # the manifest saved beside the workspace
    (ws / "ok.txt").write_text("changed\n")
    with open(os.fsencode(ws) + b"/caf\xe9.txt", "wb") as fh:
        fh.write(b"replaced\n")
    snap = snapshot(
        repo, ws, branch="agent/1", parent_sha=base, message="m", author=ANA, committer=ANA,
        limits=SnapshotLimits(), manifest=manifest,
    )  # fmt: skip
    assert [s.path for s in snap.skipped] == ["caf\\xe9.txt"] and snap.changed_files == ["ok.txt"]
    assert (
        tree_entries(repo, snap.sha)[os.fsdecode(b"caf\xe9.txt")]
        == tree_entries(repo, base)[os.fsdecode(b"caf\xe9.txt")]
    )
    msgspec.json.encode(snap)


def test_hostile_base_names_are_not_checked_out_and_are_kept(tmp_path: Path) -> None:
    r = Repo(tmp_path, {".GIT/config": (BLOB, b"[core]\n"), "ok.txt": (BLOB, b"ok\n")})
    assert not (r.ws / ".GIT").exists() and (r.ws / "ok.txt").exists()
    (r.ws / "ok.txt").write_text("changed\n")
    snap = r.snap()
    assert r.changes(snap) == {"ok.txt": (BLOB, pygit2.hash(b"changed\n"))}
    assert ".GIT/config" in tree_entries(r.repo, snap.sha)


def test_submodule_paths_are_kept_whatever_the_work_tree_holds(tmp_path: Path) -> None:
    r = Repo(tmp_path, {"lib": (GITLINK, SUB), "x/sub": (GITLINK, SUB), "x/f": (BLOB, b"f\n")})
    (r.ws / "lib").mkdir()
    (r.ws / "lib" / "file").write_text("inside the submodule\n")
    (r.ws / "x" / "f").unlink()
    (r.ws / "x").rmdir()
    (r.ws / "x").write_text("a file where a directory with a submodule was\n")
    snap = r.snap()
    assert {s.path for s in snap.skipped} == {"lib", "x"}
    assert r.changes(snap) == {}  # x/f's deletion went with the refused x: the base's x/ stays


@pytest.mark.parametrize(
    ("path", "content", "why"),
    [
        (".gitmodules", b'[submodule "m"]\n\tpath = m\n\turl = -oProxyCommand=evil\n', "option injection"),
        (".gitmodules", b'[submodule "m"]\n\tpath = -m\n\turl = https://e.x/r\n', "option injection"),
        ("d/.gitmodules", b'[submodule "../../m"]\n\tpath = m\n\turl = https://e.x/r\n', "unsafe submodule name"),
        (".gitmodules", b'[submodule "m"]\n\tupdate = !rm -rf /\n', "runs a command"),
        (".gitmodules", b"[submodule\n", "does not parse"),
    ],
)
def test_unsafe_gitmodules_are_refused(tmp_path: Path, path: str, content: bytes, why: str) -> None:
    r = Repo(tmp_path, {"README": (BLOB, b"r\n")})
    (r.ws / path).parent.mkdir(exist_ok=True)
    (r.ws / path).write_bytes(content)
    snap = r.snap()
    assert [s.path for s in snap.skipped] == [path] and why in snap.skipped[0].reason
    assert r.changes(snap) == {}


def test_symlinks_the_agent_writes(tmp_path: Path) -> None:
    r = Repo(tmp_path, {"ext": (LINK, b"/etc"), "l": (LINK, b"d/x/.."), "d/f": (BLOB, b"f\n")})
    (r.ws / ".gitmodules").symlink_to("d/f")  # a symlinked .gitmodules: refused
    (r.ws / "through").symlink_to("ext/passwd")  # through the base's escaping link: refused
    (r.ws / "d" / "x").symlink_to("..")  # inside by itself, but the base's `l` would escape: refused
    (r.ws / "fine").symlink_to("d/f")
    snap = r.snap()
    assert {s.path for s in snap.skipped} == {".gitmodules", "through", "d/x"}
    assert r.changes(snap) == {"fine": (LINK, pygit2.hash(b"d/f"))}
    assert fsck_strict(r.path).returncode == 0


def test_mode_changes_and_the_base_mode_of_unchanged_files(tmp_path: Path) -> None:
    r = Repo(tmp_path, {"run.sh": (BLOB, b"#!/bin/sh\n"), "tool": (EXEC, b"t\n"), "big": (BLOB, b"b" * 300)})
    (r.ws / "run.sh").chmod(0o755)
    (r.ws / "big").chmod(0o755)  # over the size limit, content unchanged: the mode change is taken
    snap = r.snap(max_file_bytes=100)
    assert r.changes(snap) == {
        "run.sh": (EXEC, pygit2.hash(b"#!/bin/sh\n")),
        "big": (EXEC, pygit2.hash(b"b" * 300)),
    }
    assert snap.skipped == []


def test_a_change_that_keeps_size_and_times_is_still_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The checkout's stat of a.txt is trusted: no racy window here (the checkout computes its
    # window when it ends, so no pause after it could make a stat it just took trusted) ...
    monkeypatch.setattr(git_checkout, "_RACY_NS", 0)
    r = Repo(tmp_path, {"a.txt": (BLOB, b"aaaa\n")})
    st = (r.ws / "a.txt").stat()
    # ... and the change below lands in a later tick of the file clock, as past the window.
    tick = tmp_path / "tick"

    def ticked() -> bool:
        tick.write_bytes(b"")
        return tick.stat().st_ctime_ns > st.st_ctime_ns

    until_sync(ticked, timeout=10, what="the file clock to move past a.txt's change time")
    (r.ws / "a.txt").write_bytes(b"bbbb\n")
    os.utime(r.ws / "a.txt", ns=(st.st_atime_ns, st.st_mtime_ns))  # the change time cannot be put back
    assert r.changes(r.snap()) == {"a.txt": (BLOB, pygit2.hash(b"bbbb\n"))}
