"""The workspace quota's pure parts: when a workspace counts as full, the watchdog's walk, the
refusals without root, and the settings that choose the limit and how it is held."""

import os
from pathlib import Path

import pytest

from forge.core.settings import SettingsError, load_settings
from sandbox import MiB, WorkspaceQuotaUnavailable, WorkspaceUsage, prepare_workspace, quota, workspace_usage
from sandbox.quota import WorkspaceWatch, full_margin, image_path, mount_quota, quota_mounts, tree_bytes
from tests.support.waiting import until


def usage(kind: quota.QuotaKind, *, limit: int, used: int, files_free: int | None = None) -> WorkspaceUsage:
    return WorkspaceUsage(
        enforced_by=kind, limit_bytes=limit, used_bytes=used, free_bytes=limit - used, files_free=files_free
    )


def test_a_mount_is_full_just_before_its_last_block_or_without_inodes() -> None:
    limit = 1024 * MiB
    assert full_margin(limit) == limit // 200 and full_margin(64 * MiB) == MiB
    assert not usage("mount", limit=limit, used=limit - full_margin(limit), files_free=10).full
    assert usage("mount", limit=limit, used=limit - full_margin(limit) + 1, files_free=10).full
    assert usage("mount", limit=limit, used=MiB, files_free=0).full  # a million empty files fill it too


def test_the_watchdog_is_full_at_the_limit() -> None:
    assert not usage("watchdog", limit=8 * MiB, used=8 * MiB - 1).full
    assert usage("watchdog", limit=8 * MiB, used=8 * MiB).full


def test_the_image_lives_beside_the_workspace_out_of_the_agents_reach(tmp_path: Path) -> None:
    ws = tmp_path / "workspaces" / "task" / "run"
    assert image_path(ws) == tmp_path / "workspaces" / "task" / "run.img"
    assert ws not in image_path(ws).parents


def test_tree_bytes_counts_blocks_once_and_never_follows_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(4 * MiB))
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "a.bin").write_bytes(os.urandom(MiB))
    os.link(ws / "d" / "a.bin", ws / "hard.bin")  # the same blocks twice: counted once
    (ws / "link").symlink_to(outside)
    (ws / "dirlink").symlink_to(tmp_path)
    with open(ws / "sparse", "wb") as fh:
        fh.truncate(512 * MiB)  # a large size that takes no disk
    total = tree_bytes(ws, deadline=float("inf"))
    assert MiB <= total < MiB + 256 * 1024
    got = workspace_usage(ws, 2 * MiB)
    assert got.enforced_by == "watchdog" and got.used_bytes == total and not got.full
    assert workspace_usage(ws, MiB).full


def test_tree_bytes_stops_at_its_deadline(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 8192)
    assert tree_bytes(tmp_path, deadline=0.0) == 0


async def test_the_watch_stays_at_limit_reached_once_seen(tmp_path: Path) -> None:
    watch = WorkspaceWatch(tmp_path, 2 * MiB)
    assert watch.enforced_by == "watchdog"
    assert not await watch.check()
    (tmp_path / "big").write_bytes(os.urandom(3 * MiB))
    assert await watch.check() and watch.last is not None and watch.last.full
    (tmp_path / "big").unlink()  # filled, then emptied: the run still reached its limit
    assert await watch.check() and watch.limit_reached


async def test_the_watch_looks_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WorkspaceWatch, "WATCHDOG_INTERVAL", 0.05)
    watch = WorkspaceWatch(tmp_path, MiB)
    watch.start()
    try:
        (tmp_path / "big").write_bytes(os.urandom(2 * MiB))
        assert await until(lambda: watch.limit_reached, timeout=30, what="the watch to see the limit reached")
    finally:
        watch.stop()


def test_without_root_a_quota_is_a_clear_error_never_an_unlimited_workspace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(quota.os, "geteuid", lambda: 1001)
    reason = quota.quota_unavailable_reason()
    assert reason is not None and "root" in reason and "1001" in reason
    ws = tmp_path / "ws"
    with pytest.raises(WorkspaceQuotaUnavailable, match="needs root") as caught:
        prepare_workspace(ws, limit_bytes=64 * MiB)
    assert "watchdog" in str(caught.value)  # the hint names the fallback
    assert not image_path(ws).exists()


def test_missing_tools_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quota.os, "geteuid", lambda: 0)
    monkeypatch.setattr(quota.shutil, "which", lambda tool: None if tool == "mkfs.ext4" else f"/usr/bin/{tool}")
    assert "mkfs.ext4 is not installed" in (quota.quota_unavailable_reason() or "")


def test_a_tiny_quota_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least"):
        mount_quota(tmp_path, MiB, owner=(1000, 1000))


def test_settings_choose_the_limit_and_how_it_is_held() -> None:
    s = load_settings(environ={})
    assert s.task_workspace_limit_mb == 1024 and s.task_workspace_quota == "mount"
    s = load_settings(environ={"FORGEHAND_TASK_WORKSPACE_LIMIT_MB": "64", "FORGEHAND_TASK_WORKSPACE_QUOTA": "watchdog"})
    assert s.task_workspace_limit_mb == 64 and s.task_workspace_quota == "watchdog"
    with pytest.raises(SettingsError, match="FORGEHAND_TASK_WORKSPACE_LIMIT_MB: must be a positive"):
        load_settings(environ={"FORGEHAND_TASK_WORKSPACE_LIMIT_MB": "0"})
    with pytest.raises(SettingsError, match="FORGEHAND_TASK_WORKSPACE_LIMIT_MB: must be at least 16"):
        load_settings(environ={"FORGEHAND_TASK_WORKSPACE_LIMIT_MB": "8"})
    assert load_settings(
        environ={"FORGEHAND_TASK_WORKSPACE_LIMIT_MB": "8", "FORGEHAND_TASK_WORKSPACE_QUOTA": "watchdog"}
    )
    with pytest.raises(SettingsError, match="FORGEHAND_TASK_WORKSPACE_QUOTA"):
        load_settings(environ={"FORGEHAND_TASK_WORKSPACE_QUOTA": "none"})


def test_quota_mounts_are_found_in_mountinfo_with_escaped_names(tmp_path: Path) -> None:
    root = tmp_path / "data"
    mountinfo = "\n".join(
        [
            "22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
            f"46 27 7:0 / {root}/workspaces/t/r1 rw,nosuid,nodev,noatime - ext4 /dev/loop0 rw",
            f"47 27 7:1 / {root}/workspaces/t/with\\040space rw,nosuid - ext4 /dev/loop1 rw",
            f"48 27 0:50 / {root}/workspaces/t/tmp rw - tmpfs tmpfs rw",  # not a quota mount
            f"49 27 7:2 / {tmp_path}/other/r2 rw - ext4 /dev/loop2 rw",  # not under the root
            f"50 27 7:3 / {root}x/r3 rw - ext4 /dev/loop3 rw",  # a sibling sharing the prefix
        ]
    )
    assert quota_mounts(root, mountinfo=mountinfo) == [
        root / "workspaces" / "t" / "r1",
        root / "workspaces" / "t" / "with space",
    ]
    assert quota_mounts(tmp_path / "nothing") == []
