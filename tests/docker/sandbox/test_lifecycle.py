"""Sandbox life against the real engine: start, exec, stream, stdin, stop, remove, reap, errors."""

import asyncio
import time
from pathlib import Path

import pytest

from sandbox import (
    EngineUnavailable,
    ImageMissing,
    Limits,
    Sandbox,
    SandboxEngine,
    SandboxGone,
    SpecRefused,
    list_sandboxes,
    reap,
)
from tests.docker.conftest import INSTANCE, SpecFactory
from tests.support.waiting import until


async def test_exec_basics(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["sh", "-c", "echo out; echo err >&2; pwd; exit 3"])
    assert r.exit_code == 3
    assert r.stdout == b"out\n/workspace\n"
    assert r.stderr == b"err\n"
    assert not r.timed_out and not r.oom_killed and r.truncated_bytes == 0


async def test_argv_is_never_a_shell_string(sandbox: Sandbox) -> None:
    r = await sandbox.exec(["echo", "$(id); `id` && rm -rf / ; *"])
    assert r.stdout == b"$(id); `id` && rm -rf / ; *\n"
    with pytest.raises(SpecRefused):
        sandbox.stream("echo hi")


async def test_env_cwd_and_stdin(sandbox: Sandbox) -> None:
    await sandbox.exec(["mkdir", "-p", "/workspace/sub"])
    r = await sandbox.exec(
        ["sh", "-c", 'pwd; echo "$GREETING"; cat'],
        env={"GREETING": "hi there"},
        cwd="/workspace/sub",
        stdin=b"from stdin",
    )
    assert r.stdout == b"/workspace/sub\nhi there\nfrom stdin"
    big = bytes(range(256)) * 8192  # 2 MiB both ways: stdin and stdout flow at the same time
    r = await sandbox.exec(["cat"], stdin=big, output_cap=4 << 20)
    assert r.stdout == big
    r = await sandbox.exec(["cat"], stdin=b"")
    assert r.exit_code == 0 and r.stdout == b""


async def test_stream_yields_chunks_as_they_come(sandbox: Sandbox) -> None:
    seen: list[tuple[str, bytes, float]] = []
    t0 = time.monotonic()
    async with sandbox.stream(["sh", "-c", "echo one; sleep 0.5; echo two >&2; sleep 0.5; echo three"]) as s:
        async for chunk in s:
            seen.append((chunk.stream, chunk.data, time.monotonic() - t0))
    assert [(n, d) for n, d, _ in seen] == [("stdout", b"one\n"), ("stderr", b"two\n"), ("stdout", b"three\n")]
    # The command sleeps a second between its first and last lines: a stream that buffered to the
    # end would hand them over together (the gap, not the start-up time, which load stretches).
    assert seen[-1][2] - seen[0][2] > 0.8, ("the first line must arrive before the command ends", seen)
    assert s.result.exit_code == 0


async def test_leaving_a_stream_early_kills_the_command(sandbox: Sandbox) -> None:
    async with sandbox.stream(["sh", "-c", "echo started; exec sleep 1000"]) as s:
        async for chunk in s:
            assert chunk.data == b"started\n"
            break
    assert s.result.exit_code is None
    r = await sandbox.exec(["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])
    assert b"sleep 1000" not in r.stdout


async def test_slow_consumer_slows_the_command(sandbox: Sandbox) -> None:
    # The command writes 8 MiB of numbered lines as fast as it can, then leaves a mark. While we hold
    # back it must block (bounded buffers everywhere), not run ahead; and every byte arrives.
    script = (
        "import sys\n"
        "for i in range(8000): sys.stdout.write(f'{i:07d}' + 'x' * 1016 + '\\n')\n"
        "sys.stdout.flush()\n"
        "open('/tmp/finished', 'w').close()\n"
        "print('done', file=sys.stderr)\n"
    )
    async with sandbox.stream(["python3", "-c", script], queue_chunks=2, output_cap=64 << 20) as s:
        first = await s.__anext__()
        # An absence (the command does not run ahead): no event marks "held back", and a command
        # that was not would write its 8 MiB and leave its mark well within this time.
        await asyncio.sleep(1.5)
        probe = await sandbox.exec(["test", "-e", "/tmp/finished"])
        assert probe.exit_code == 1, "the command must be held back while nobody reads its output"
        data = bytearray(first.data)
        stderr = b""
        async for chunk in s:
            if chunk.stream == "stdout":
                data.extend(chunk.data)
            else:
                stderr += chunk.data
    assert stderr == b"done\n"
    lines = bytes(data).split(b"\n")[:-1]
    assert [int(line[:7]) for line in lines] == list(range(8000))
    assert s.result.exit_code == 0 and s.result.truncated_bytes == 0
    assert (await sandbox.exec(["test", "-e", "/tmp/finished"])).exit_code == 0


async def test_stop_and_remove_are_idempotent(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec())
    assert await sb.status() == "running"
    t0 = time.monotonic()
    await sb.stop(grace=5)
    assert time.monotonic() - t0 < 4, "docker-init forwards SIGTERM: no need to wait for SIGKILL"
    assert await sb.status() == "exited"
    await sb.stop(grace=1)
    with pytest.raises(SandboxGone):
        await sb.exec(["true"])
    await sb.remove()
    await sb.remove()
    assert await sb.status() == "removed"
    with pytest.raises(SandboxGone):
        await sb.exec(["true"])


async def ended(sb: Sandbox) -> bool:
    return await sb.status() != "running"


async def test_wall_clock_ends_the_sandbox(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec(limits=Limits(wall_clock_seconds=2)))
    async with sb:
        r = await sb.exec(["sleep", "30"])
        assert r.timed_out, "an exec is clamped to what is left of the wall clock"
        assert r.duration < 4
        await until(lambda: ended(sb), timeout=30, what="the wall clock to stop the sandbox")
        assert await sb.status() == "exited"
        with pytest.raises(SandboxGone):
            await sb.exec(["true"])


async def test_wall_clock_even_when_the_idle_process_is_stopped(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec(limits=Limits(wall_clock_seconds=3)))
    async with sb:
        # The agent freezes the idle process so it never exits; the host-side timer still stops it.
        freeze = "for p in /proc/[0-9]*; do grep -q '^sleep' $p/cmdline && kill -STOP ${p#/proc/}; done; echo ok"
        r = await sb.exec(["sh", "-c", freeze])
        assert r.stdout == b"ok\n"
        await until(lambda: ended(sb), timeout=30, what="the host-side timer to stop the sandbox")
        assert await sb.status() == "exited"


async def test_list_and_reap(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    a = await engine.start(make_spec(run="keep-me"))
    b = await engine.start(make_spec(run="reap-me-1"))
    c = await engine.start(make_spec(run="reap-me-2"))
    await c.stop(grace=0)  # stopped containers are reaped too
    try:
        listed = {s.run: s for s in await list_sandboxes(engine, INSTANCE)}
        assert {"keep-me", "reap-me-1", "reap-me-2"} <= set(listed)
        assert listed["keep-me"].status == "running"
        assert listed["reap-me-2"].status == "exited"
        assert listed["keep-me"].instance == INSTANCE
        assert all(s.instance == INSTANCE for s in await list_sandboxes(engine, INSTANCE))
        removed = await reap(engine, INSTANCE, keep={"keep-me"})
        assert {"reap-me-1", "reap-me-2"} <= {s.run for s in removed}
        assert "keep-me" not in {s.run for s in removed}
        assert await a.status() == "running"
        assert await b.status() == "removed"
        assert await c.status() == "removed"
        # Another instance's containers are never touched.
        assert await reap(engine, INSTANCE + "-other", keep=set()) == []
        assert await a.status() == "running"
    finally:
        for sb in (a, b, c):
            await sb.remove()


async def test_missing_image_is_a_typed_error(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    with pytest.raises(ImageMissing) as info:
        await engine.start(make_spec(image="forgehand-sandbox:does-not-exist"))
    assert "forgehand sandbox build" in str(info.value)


async def test_no_engine_is_a_typed_error(make_spec: SpecFactory, tmp_path: Path) -> None:
    async with SandboxEngine(f"unix://{tmp_path}/nothing.sock", api_timeout=5) as eng:
        with pytest.raises(EngineUnavailable) as info:
            await eng.start(make_spec())
        assert "start Docker" in str(info.value)
        with pytest.raises(EngineUnavailable):
            await eng.ping()


async def test_engine_refusal_is_a_typed_error(engine: SandboxEngine, make_spec: SpecFactory, tmp_path: Path) -> None:
    with pytest.raises(SpecRefused):
        await engine.start(make_spec(workspace=tmp_path / "missing"))
    with pytest.raises(SpecRefused):
        # Docker refuses a CPU quota above the host's CPUs.
        await engine.start(make_spec(limits=Limits(nano_cpus=10_000 * 1_000_000_000)))


async def test_background_processes_end_with_their_command_unless_kept(sandbox: Sandbox) -> None:
    listing = ["sh", "-c", "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"]
    r = await sandbox.exec(["sh", "-c", "sleep 1231 >/dev/null 2>&1 & echo started"])
    assert r.stdout == b"started\n"
    assert b"sleep 1231" not in (await sandbox.exec(listing)).stdout
    r = await sandbox.exec(["sh", "-c", "sleep 1232 >/dev/null 2>&1 & echo started"], keep_background=True)
    assert r.stdout == b"started\n" and r.duration < 2
    assert b"sleep 1232" in (await sandbox.exec(listing)).stdout
