"""Host-side workspace file access: links, '..', absolute paths, special files and sizes refused."""

import os
import threading
from pathlib import Path

import pytest

from sandbox import (
    WorkspaceFileTooLarge,
    WorkspacePathRefused,
    list_workspace,
    read_workspace_file,
    write_workspace_file,
)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("print('a')\n")
    return root


def test_read_and_write_roundtrip(ws: Path) -> None:
    assert read_workspace_file(ws, "src/a.py", 100) == b"print('a')\n"
    write_workspace_file(ws, "new/dir/b.txt", b"hello", 100)
    assert (ws / "new" / "dir" / "b.txt").read_bytes() == b"hello"
    assert read_workspace_file(ws, "./new//dir/b.txt", 100) == b"hello"
    write_workspace_file(ws, "new/dir/b.txt", b"again", 100)
    assert read_workspace_file(ws, "new/dir/b.txt", 100) == b"again"
    # No temporary files left behind.
    assert [e.name for e in list_workspace(ws, "new/dir")] == ["b.txt"]


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "src/../../x", "src/..", "a\x00b", ""])
def test_paths_refused(ws: Path, bad: str) -> None:
    with pytest.raises(WorkspacePathRefused):
        read_workspace_file(ws, bad, 100)
    with pytest.raises(WorkspacePathRefused):
        write_workspace_file(ws, bad, b"x", 100)


def test_symlinked_file_refused(ws: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host secret")
    (ws / "leak").symlink_to(secret)
    (ws / "rel-leak").symlink_to("../secret")
    (ws / "inside-link").symlink_to("src/a.py")  # even a link that stays inside: never followed
    for name in ("leak", "rel-leak", "inside-link"):
        with pytest.raises(WorkspacePathRefused):
            read_workspace_file(ws, name, 100)


def test_symlinked_directory_refused(ws: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    (ws / "d").symlink_to(outside)
    with pytest.raises(WorkspacePathRefused):
        read_workspace_file(ws, "d/f", 100)
    with pytest.raises(WorkspacePathRefused):
        write_workspace_file(ws, "d/g", b"x", 100)
    assert not (outside / "g").exists()
    with pytest.raises(WorkspacePathRefused):
        list_workspace(ws, "d")


def test_write_replaces_a_symlink_instead_of_following_it(ws: Path, tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_text("untouched")
    (ws / "out").symlink_to(target)
    write_workspace_file(ws, "out", b"new", 100)
    assert target.read_text() == "untouched"
    assert not (ws / "out").is_symlink()
    assert (ws / "out").read_bytes() == b"new"


def test_fifo_refused_without_blocking(ws: Path) -> None:
    os.mkfifo(ws / "pipe")
    done = threading.Event()

    def attempt() -> None:
        with pytest.raises(WorkspacePathRefused):
            read_workspace_file(ws, "pipe", 100)
        done.set()

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(5)
    assert done.is_set(), "reading a FIFO must not block"


def test_size_caps(ws: Path) -> None:
    (ws / "big").write_bytes(b"x" * 101)
    with pytest.raises(WorkspaceFileTooLarge):
        read_workspace_file(ws, "big", 100)
    assert read_workspace_file(ws, "big", 101) == b"x" * 101
    with pytest.raises(WorkspaceFileTooLarge):
        write_workspace_file(ws, "w", b"x" * 11, 10)
    assert not (ws / "w").exists()


def test_write_onto_directory_refused(ws: Path) -> None:
    with pytest.raises(WorkspacePathRefused):
        write_workspace_file(ws, "src", b"x", 100)


def test_list_reports_links_without_following(ws: Path) -> None:
    (ws / "link").symlink_to("/etc")
    os.mkfifo(ws / "fifo")
    entries = {e.name: e for e in list_workspace(ws)}
    assert entries["src"].kind == "dir"
    assert entries["link"].kind == "symlink"
    assert entries["fifo"].kind == "other"
    assert [(e.name, e.kind, e.size) for e in list_workspace(ws, "src")] == [("a.py", "file", 11)]


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership hand-over only happens as root")
def test_files_written_as_root_belong_to_the_workspace_owner(ws: Path) -> None:
    os.chown(ws, 1000, 1000)
    write_workspace_file(ws, "sub/f", b"x", 10)
    assert (ws / "sub").stat().st_uid == 1000
    assert (ws / "sub" / "f").stat().st_uid == 1000
