"""Sandbox.spawn on the real engine: an interactive process with stdin open and stdout as lines."""

import asyncio
from collections.abc import AsyncIterator

import pytest

from sandbox import CutLine, ProcessEnded, Sandbox, SandboxEngine, SandboxError, truncated
from tests.docker.conftest import SpecFactory

# A line echo that flushes after every line (python3 -u), with a prefix so the test sees it was
# the process that answered.
ECHO = ["python3", "-u", "-c", "import sys\nfor line in sys.stdin:\n    print('got ' + line.strip())"]


async def test_echo_loop_interleaves_writes_and_lines(sandbox: Sandbox) -> None:
    async with sandbox.spawn(ECHO, timeout=60) as p:
        lines = p.stdout_lines()
        for word in ("one", "two", "three"):
            await p.write(word.encode() + b"\n")
            # Each answer arrives before the next question is written: the process is interactive.
            line = await asyncio.wait_for(anext(lines), 20)
            assert line == b"got " + word.encode()
            assert not truncated(line)
        await p.close_stdin()
        assert [line async for line in lines] == []
        assert await asyncio.wait_for(p.wait(), 20) == 0
        assert p.returncode == 0


async def test_stdin_close_ends_cat_and_the_env_and_cwd_apply(sandbox: Sandbox) -> None:
    p = await sandbox.spawn(["sh", "-c", 'echo "$GREETING $(id -u) $(pwd)"; cat'], env={"GREETING": "hi"}, cwd="/tmp")
    await p.write(b"alpha\nbeta")  # the last line has no newline: it still comes out, whole
    await p.close_stdin()
    out = [bytes(line) async for line in p.stdout_lines()]
    assert out == [b"hi 1000 /tmp", b"alpha", b"beta"]
    assert await asyncio.wait_for(p.wait(), 20) == 0
    with pytest.raises(ProcessEnded):
        await p.write(b"late\n")


async def test_a_huge_line_is_capped_and_flagged_and_the_next_line_is_whole(sandbox: Sandbox) -> None:
    script = "import sys; sys.stdout.write('x' * 3_000_000 + '\\nafter\\n'); sys.stderr.write('e' * 100_000)"
    async with sandbox.spawn(["python3", "-c", script], timeout=60, line_cap=1 << 20, stderr_cap=1000) as p:
        lines = [line async for line in p.stdout_lines()]
        assert await p.wait() == 0
    assert len(lines) == 2
    cut = lines[0]
    assert isinstance(cut, CutLine) and truncated(cut)
    assert len(cut) == 1 << 20 and cut.dropped == 3_000_000 - (1 << 20)
    assert set(lines[0]) == {ord("x")}
    assert lines[1] == b"after" and not truncated(lines[1])
    assert p.truncated_lines == 1
    assert p.stderr_tail == "e" * 1000  # only the tail is kept


async def test_kill_mid_output_ends_the_process_group(sandbox: Sandbox) -> None:
    # The child in the background keeps printing too: kill takes the whole tree.
    cmd = ["sh", "-c", "(while :; do echo child; sleep 0.01; done) & while :; do echo parent; sleep 0.01; done"]
    p = await sandbox.spawn(cmd, timeout=120)
    seen = 0
    async for _line in p.stdout_lines():
        seen += 1
        if seen == 20:
            await p.kill()
            break
    assert await asyncio.wait_for(p.wait(), 20) == 137
    assert p.killed and not p.timed_out
    check = await sandbox.exec(["sh", "-c", "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done"])
    assert b"while :" not in check.stdout


async def test_wait_after_the_reader_left_mid_stream_returns_the_exit(sandbox: Sandbox) -> None:
    """A consumer reads a line, leaves the loop (`break`: its generator is closed later, when it is
    collected) and waits. The output was far ahead of it (one batch of room, so the reader is parked
    on a full queue): what nobody will read is dropped, and the exit code comes."""
    p = await sandbox.spawn(["seq", "1", "200000"], timeout=120, queue_batches=1)
    async for line in p.stdout_lines():
        assert line == b"1"
        break
    assert await asyncio.wait_for(p.wait(), 30) == 0


async def test_timeout_kills_the_process(sandbox: Sandbox) -> None:
    p = await sandbox.spawn(["sleep", "100"], timeout=1.5)
    assert [line async for line in p.stdout_lines()] == []
    await asyncio.wait_for(p.wait(), 20)
    assert p.timed_out  # long before `sleep 100` would have ended: the bound above


async def test_removing_the_sandbox_ends_a_running_process(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec())
    p = await sb.spawn(["sh", "-c", "echo ready; cat"], timeout=120)
    lines = p.stdout_lines()
    assert await asyncio.wait_for(anext(lines), 20) == b"ready"
    await sb.remove()
    # The reader ends, the process counts as killed (or unknown: the container is gone), and
    # nothing hangs.
    assert await asyncio.wait_for(_rest(lines), 20) == []
    assert await asyncio.wait_for(p.wait(), 20) in (None, 137)
    assert not p.running
    with pytest.raises(ProcessEnded):
        await p.write(b"anyone?\n")


async def _rest(lines: AsyncIterator[bytes]) -> list[bytes]:
    return [bytes(line) async for line in lines]


async def test_a_slow_reader_slows_the_process_down_and_loses_nothing(sandbox: Sandbox) -> None:
    # 20000 numbered lines (about 1 MiB with padding); the reader sleeps now and then: the process
    # blocks on its full pipe meanwhile, and every line arrives, in order.
    script = "for i in range(20000): print(f'{i:08d}' + '.' * 40)"
    async with sandbox.spawn(["python3", "-c", script], timeout=120, queue_batches=4) as p:
        got = 0
        async for line in p.stdout_lines():
            assert line[:8] == f"{got:08d}".encode()
            got += 1
            if got % 5000 == 0:
                await asyncio.sleep(0.3)  # the slow reader: the scenario
        assert await p.wait() == 0
    assert got == 20000


async def test_wait_without_a_reader_discards_lines_and_does_not_hang(sandbox: Sandbox) -> None:
    p = await sandbox.spawn(["sh", "-c", "seq 1 100000; echo done >&2"], timeout=60, queue_batches=2)
    assert await asyncio.wait_for(p.wait(), 30) == 0
    assert p.stderr_tail == "done\n"


async def test_a_process_that_cannot_start_ends_its_readers(sandbox: Sandbox) -> None:
    p = sandbox.spawn(["true"], timeout=30)
    await sandbox.stop(grace=0)  # the container is no longer running: the exec is refused
    with pytest.raises(SandboxError):
        await p.start()
    assert [line async for line in p.stdout_lines()] == []
    assert await asyncio.wait_for(p.wait(), 5) is None
    closed = sandbox.spawn(["true"], timeout=30)
    await closed.aclose()  # closed before it started: it never starts, nothing waits
    assert [line async for line in closed.stdout_lines()] == []
    assert await asyncio.wait_for(closed.wait(), 5) is None
