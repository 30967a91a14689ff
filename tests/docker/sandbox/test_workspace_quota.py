"""The workspace quota against the real engine: a loop-mounted ext4 image per workspace.

A writer past the limit gets ENOSPC inside the sandbox and the sandbox reports the limit reached; the
host's disk grows by at most the limit; a normal run under it is unaffected; the mount outlives the
process that made it (a crash) and an image left without its mount (a reboot) is mounted again as it
is; cleanup leaves no mount, no loop device and no image. The watchdog fallback and the scratch
tmpfs (noexec) too."""

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandbox import (
    Limits,
    MiB,
    Sandbox,
    SandboxEngine,
    SpecRefused,
    WorkspaceQuotaUnavailable,
    prepare_workspace,
    read_workspace_file,
    remove_workspace,
    workspace_usage,
    write_workspace_file,
)
from sandbox.quota import image_path, is_mounted
from tests.docker.conftest import SpecFactory
from tests.support.waiting import until

pytestmark = pytest.mark.docker

LIMIT = 64 * MiB


def host_blocks(root: Path) -> int:
    """Bytes of the host's disk taken under `root`, not counting what is inside a mount below it."""
    dev = os.stat(root).st_dev
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if os.stat(os.path.join(dirpath, d)).st_dev == dev]
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            total += st.st_blocks * 512
    return total


def mounted_at(path: Path) -> bool:
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        return any(line.split()[4] == str(path) for line in fh)


def loop_device_of(image: Path) -> bool:
    """Whether a loop device still holds `image` (autoclear should have detached it)."""
    out = subprocess.run(["losetup", "-a"], capture_output=True, text=True, timeout=30, check=True).stdout
    return str(image) in out


async def wait_for(sb: Sandbox, *, seconds: float) -> bool:
    with contextlib.suppress(AssertionError):  # the caller says what it means when it is not
        await until(lambda: sb.disk_limit_reached, timeout=seconds, what="the workspace seen full")
    return sb.disk_limit_reached


async def watch_looks(sb: Sandbox, looks: int) -> None:
    """Until the sandbox's workspace watch has looked `looks` more times, the last one begun
    after this was called."""
    watch = sb._workspace_watch
    seen: list[object] = [watch.last]

    def looked() -> bool:
        if watch.last is not seen[-1]:
            seen.append(watch.last)
        return len(seen) > looks  # the first look seen may have begun before; the next ones did not

    await until(looked, timeout=30, what=f"{looks} looks of the workspace watch")


async def test_a_writer_past_the_limit_gets_enospc_and_the_host_disk_grows_by_at_most_the_limit(
    engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path
) -> None:
    ws = prepare_workspace(tmp_path / "runs" / "task" / "run", limit_bytes=LIMIT)
    before = host_blocks(tmp_path)
    try:
        async with await engine.start(make_spec(workspace=ws)) as sb:
            assert sb.workspace_quota == "mount" and not sb.disk_limit_reached
            t0 = time.monotonic()
            r = await sb.exec(["sh", "-c", "dd if=/dev/zero of=big bs=1M count=700; echo rc=$?; stat -c %s big"])
            assert b"No space left on device" in r.stderr, r
            rc, size = r.stdout.decode().split()
            assert rc != "rc=0" and int(size) <= LIMIT
            r = await sb.exec(["fallocate", "-l", "700M", "big2"])  # no page cache to hide behind
            assert r.exit_code != 0 and b"No space left on device" in r.stderr, r
            assert await wait_for(sb, seconds=2), "the sandbox did not see its workspace full"
            assert time.monotonic() - t0 < 20
            usage = workspace_usage(ws, LIMIT)
            assert usage.enforced_by == "mount" and usage.full and LIMIT * 0.9 < usage.limit_bytes <= LIMIT
            # The host's own writes into the workspace stop at the same place.
            with pytest.raises(OSError, match="No space left"):
                write_workspace_file(ws, "host.bin", os.urandom(8 * MiB), 16 * MiB)
        grown = host_blocks(tmp_path) - before
        assert 0 < grown <= LIMIT, grown
        assert os.stat(image_path(ws)).st_size == LIMIT
    finally:
        remove_workspace(ws)
    assert not mounted_at(ws) and not ws.exists() and not image_path(ws).exists()
    assert not loop_device_of(image_path(ws))


async def test_a_run_under_the_limit_is_unaffected_and_the_host_reads_it_afterwards(
    engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path
) -> None:
    ws = prepare_workspace(tmp_path / "run", limit_bytes=LIMIT)
    try:
        assert os.listdir(ws) == []  # no lost+found for the agent to trip over
        async with await engine.start(make_spec(workspace=ws)) as sb:
            script = "head -c 20M /dev/urandom > data.bin && mkdir -p src && echo hi > src/a.txt && df -B1 . | tail -1"
            r = await sb.exec(["sh", "-c", script])
            assert r.ok, r
            assert int(r.stdout.split()[1]) <= LIMIT  # the sandbox sees the quota's size
            await watch_looks(sb, 2)
            assert not sb.disk_limit_reached and not await sb.check_disk_limit()
        # The container is gone; the work tree is still there for the snapshot.
        assert read_workspace_file(ws, "src/a.txt", 100) == b"hi\n"
        assert (ws / "data.bin").stat().st_size == 20 * MiB
    finally:
        remove_workspace(ws)
    assert not mounted_at(ws) and not image_path(ws).exists()


def test_the_mount_outlives_the_process_that_made_it_and_an_unmounted_image_is_mounted_again(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "task" / "run"
    # Another process prepares the workspace, writes into it and dies without cleaning up (a crash).
    child = (
        "import os, sys; from pathlib import Path; from sandbox import prepare_workspace\n"
        f"ws = prepare_workspace(Path({str(ws)!r}), limit_bytes={LIMIT})\n"
        "(ws / 'work.txt').write_text('half done')\n"
        "os._exit(9)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], timeout=60, check=False)
    assert done.returncode == 9
    try:
        assert mounted_at(ws) and (ws / "work.txt").read_text() == "half done"
        # Preparing it again (recovery) keeps it as it is.
        prepare_workspace(ws, limit_bytes=LIMIT)
        assert (ws / "work.txt").read_text() == "half done"
        # A reboot drops the mount but keeps the image: it is mounted again, never reformatted.
        subprocess.run(["umount", str(ws)], timeout=30, check=True)
        assert not is_mounted(ws) and not (ws / "work.txt").exists()
        prepare_workspace(ws, limit_bytes=LIMIT)
        assert is_mounted(ws) and (ws / "work.txt").read_text() == "half done"
    finally:
        remove_workspace(ws)
    assert not mounted_at(ws) and not ws.exists() and not image_path(ws).exists()
    assert not loop_device_of(image_path(ws))


async def test_cleanup_while_something_still_holds_the_mount(tmp_path: Path) -> None:
    ws = prepare_workspace(tmp_path / "run", limit_bytes=LIMIT)
    holder = subprocess.Popen(["sleep", "60"], cwd=ws)  # a process with its cwd inside: umount is busy
    try:
        remove_workspace(ws)
        assert not mounted_at(ws) and not image_path(ws).exists()
    finally:
        holder.kill()
        holder.wait(timeout=10)
    assert not loop_device_of(image_path(ws))


async def test_without_a_mount_the_watchdog_ends_at_the_limit_but_cannot_stop_the_burst(
    engine: SandboxEngine, make_spec: SpecFactory, workspace: Path
) -> None:
    limits = Limits(workspace_bytes=8 * MiB, wall_clock_seconds=120, exec_timeout_seconds=60)
    async with await engine.start(make_spec(limits=limits)) as sb:
        assert sb.workspace_quota == "watchdog"
        r = await sb.exec(["sh", "-c", "head -c 20M /dev/zero > big && echo written"])
        assert r.ok and r.stdout == b"written\n"  # the burst got through: that is the fallback's weakness
        assert await wait_for(sb, seconds=8)
    assert (workspace / "big").stat().st_size == 20 * MiB


async def test_scratch_space_is_noexec_and_the_workspace_is_not(sandbox: Sandbox) -> None:
    script = (
        "for d in /tmp /home/agent /workspace; do printf '#!/bin/sh\\necho ran\\n' > $d/x.sh; chmod +x $d/x.sh; "
        "$d/x.sh >/dev/null 2>&1 && echo $d:exec || echo $d:noexec; done; grep -E ' /tmp | /home/agent ' /proc/mounts"
    )
    r = await sandbox.exec(["sh", "-c", script])
    lines = r.stdout.decode().splitlines()
    assert lines[:3] == ["/tmp:noexec", "/home/agent:noexec", "/workspace:exec"], r
    assert all("noexec" in line.split()[3].split(",") for line in lines[3:]) and len(lines) == 5


async def test_a_sandbox_that_does_not_see_the_quota_mount_is_refused(
    engine: SandboxEngine, make_spec: SpecFactory, workspace: Path
) -> None:
    # The container binds the plain directory; the quota is mounted on it afterwards, which the
    # container (rprivate) never sees: as if dockerd lived in another mount namespace.
    sb = await engine.start(make_spec())
    try:
        prepare_workspace(workspace, limit_bytes=LIMIT)
        r = await sb.exec(["sh", "-c", "head -c 1M /dev/zero > below && echo ok"])
        assert r.ok and not (workspace / "below").exists()  # its writes go below the mount, unlimited
        with pytest.raises(SpecRefused, match="does not see the workspace's quota mount"):
            await sb.verify_workspace_mount()
        assert await sb.status() == "removed"
    finally:
        await sb.remove()
        remove_workspace(workspace)


def test_a_loop_device_lost_to_another_mount_is_tried_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`mount -o loop` losing the race for a free loop device (another run's mount got it first)
    is tried again: here a `mount` first on PATH fails that way twice, then hands over to the real
    one, and the workspace is mounted. Any other failure of mount fails at once."""
    bin_dir, count = tmp_path / "bin", tmp_path / "mount-calls"
    bin_dir.mkdir()
    real_mount = subprocess.run(["sh", "-c", "command -v mount"], capture_output=True, text=True).stdout.strip()
    fake = bin_dir / "mount"
    fake.write_text(
        "#!/bin/sh\n"
        f"echo x >> {count}\n"
        f'if [ "$(wc -l < {count})" -le 2 ]; then\n'
        '  echo "mount: $5: failed to setup loop device for $4." >&2; exit 32\n'
        "fi\n"
        f'exec {real_mount} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    ws = tmp_path / "task" / "run"
    try:
        prepare_workspace(ws, limit_bytes=LIMIT)
        assert mounted_at(ws) and count.read_text().count("x") == 3
    finally:
        remove_workspace(ws)

    # Not a loop device: refused at the first failure, with mount's own words.
    fake.write_text("#!/bin/sh\necho x >> " + str(count) + '\necho "mount: wrong fs type" >&2; exit 32\n')
    count.write_text("")
    with pytest.raises(WorkspaceQuotaUnavailable, match="wrong fs type"):
        prepare_workspace(tmp_path / "task" / "other", limit_bytes=LIMIT)
    assert count.read_text().count("x") == 1
