"""Running one command in a sandbox: the exec wrapper, the output pump, timeouts, OOM detection.

Output is read by a dedicated thread from Docker's multiplexed exec stream and handed to the event
loop through a bounded channel: when the consumer is slow the thread stops reading, the socket and
then the process's pipe fill up, and the command blocks. Nothing is dropped silently; bytes past the
output cap are read, counted and discarded (so the host's memory stays flat), and reported as
`truncated_bytes`.
"""

import asyncio
import contextlib
import socket
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from .errors import SpecRefused

if TYPE_CHECKING:
    from .engine import Sandbox

StreamName = Literal["stdout", "stderr"]

# A shell function (builtins only: during a fork bomb there is no pid to spare for `ps` or a
# subshell) that kills a process and everything it started. It stops (so nothing forks any more)
# every process whose parent, process group or session is already in the set, until a full pass over
# /proc finds nothing new, then SIGKILLs the lot. `$2` is a pid to spare (the caller itself).
_REAP_FN = """\
forgehand_reap() {
  found=" $1 "
  changed=1
  while [ "$changed" = 1 ]; do
    changed=0
    for f in /proc/[0-9]*/stat; do
      read -r line < "$f" 2>/dev/null || continue
      pid=${line%% *}
      case "$found" in *" $pid "*) continue ;; esac
      set -f
      set -- "$1" "$2" ${line##*) }
      set +f
      case "$found" in
        *" $4 "*|*" $5 "*|*" $6 "*)
          kill -STOP "$pid" 2>/dev/null
          found="$found$pid "
          changed=1 ;;
      esac
    done
  done
  for pid in $found; do [ "$pid" = "$2" ] || kill -KILL "$pid" 2>/dev/null; done
}
"""

# Runs in the container as `sh -c WRAPPER forgehand-exec LIMIT KEEP_BG ARGV...`; the command itself
# is argv (never a shell string built from input). The wrapper reports its pid on stderr before
# anything else (the host needs it to kill the command; docker exec makes it a session leader),
# runs the command under coreutils `timeout` as a second, in-container line of defence (it fires a
# second after the host's deadline and still works when the host's kill cannot start: a fork bomb
# leaves no pid for a killer exec), and when the command exits it kills whatever the command left
# running in the background, unless asked to keep it.
PID_MARKER = b"\x1eforgehand-pid:"
WRAPPER = (
    _REAP_FN
    + """\
printf '\\036forgehand-pid:%s\\n' "$$" >&2
t=$1; keep=$2; shift 2
if [ "$t" != 0 ] && command -v timeout >/dev/null 2>&1; then
  timeout -k 2 "$t" "$@"
else
  "$@"
fi
rc=$?
[ "$keep" = 1 ] || forgehand_reap "$$" "$$"
exit "$rc"
"""
)

# Kills a running command from outside (host timeout, or the consumer went away): everything in the
# wrapper's session and process tree, the wrapper included.
KILLER = (
    _REAP_FN
    + """\
kill -STOP -- "-$1" 2>/dev/null
forgehand_reap "$1" ""
kill -KILL -- "-$1" 2>/dev/null
exit 0
"""
)

# Reads the memory cgroup's OOM-kill counter (cgroup v2 first, then v1). Builtins and cat only.
OOM_COUNTER = """\
for f in /sys/fs/cgroup/memory.events /sys/fs/cgroup/memory/memory.oom_control; do
  if [ -r "$f" ]; then
    while read -r k v; do
      if [ "$k" = oom_kill ]; then echo "$v"; exit 0; fi
    done < "$f"
  fi
done
exit 3
"""

_STREAMS: dict[int, StreamName] = {1: "stdout", 2: "stderr"}
_RECV_SIZE = 256 * 1024
_POLL = 0.2  # how often blocked threads look at their cancel flag


class OutputChunk(msgspec.Struct, frozen=True):
    stream: StreamName
    data: bytes


class ExecResult(msgspec.Struct, frozen=True, kw_only=True):
    exit_code: int | None  # None when the command could not be reaped (it outlived every kill)
    timed_out: bool
    oom_killed: bool
    truncated_bytes: int  # output past the cap: read, counted, discarded
    duration: float  # seconds, from exec start to the end of its output
    stdout: bytes = b""  # filled by Sandbox.exec; the streaming form leaves these empty
    stderr: bytes = b""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


def validate_argv(argv: Sequence[str]) -> list[str]:
    if isinstance(argv, str | bytes) or not argv:
        raise SpecRefused("argv must be a non-empty list of strings (never a shell string)")
    out = list(argv)
    for arg in out:
        if not isinstance(arg, str) or "\x00" in arg:
            raise SpecRefused("argv items must be strings without NUL")
    return out


def validate_exec_env(env: Mapping[str, str] | None) -> list[str] | None:
    if not env:
        return None
    items = []
    for key, value in env.items():
        if not key or "=" in key or "\x00" in key or "\x00" in value:
            raise SpecRefused(f"bad environment entry {key!r}")
        items.append(f"{key}={value}")
    return items


class _End:
    """Marks the end of the output (or the pump's failure)."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class _Channel:
    """Thread -> event loop queue, bounded by a semaphore so the producing thread blocks when full."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_items: int) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[OutputChunk | _End] = asyncio.Queue()
        self._slots = threading.Semaphore(max_items)
        self.abandoned = threading.Event()

    def put(self, item: OutputChunk) -> bool:
        while not self._slots.acquire(timeout=_POLL):
            if self.abandoned.is_set():
                return False
        if self.abandoned.is_set():
            return False
        self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        return True

    def end(self, item: _End) -> None:
        with contextlib.suppress(RuntimeError):  # the loop may be closed already
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)

    async def get(self) -> OutputChunk | _End:
        item = await self._queue.get()
        if isinstance(item, OutputChunk):
            self._slots.release()
        return item


class _Pump:
    """Reads Docker's multiplexed stream (8-byte frame headers) in a thread; applies the output cap."""

    def __init__(self, sock: Any, channel: _Channel, cap: int) -> None:
        self._sock = sock
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._channel = channel
        self._cap = cap
        self.delivered = 0
        self.truncated = 0
        self.pid: int | None = None
        self._marker_pending = True
        self._marker_buf = b""
        self._pending = b""
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run, name="forgehand-exec-pump", daemon=True)

    def take_prebuffered(self) -> None:
        """Call before any thread touches the socket (it briefly makes the socket non-blocking)."""
        self._pending = self._prebuffered()

    def _prebuffered(self) -> bytes:
        # http.client may have read past the upgrade response's headers into its buffer.
        fp = getattr(getattr(getattr(getattr(self._sock, "_response", None), "raw", None), "_fp", None), "fp", None)
        if fp is None:
            return b""
        self._raw.setblocking(False)
        try:
            data: bytes = fp.peek(_RECV_SIZE)
            if data:
                fp.read(len(data))
        except (OSError, ValueError):
            data = b""
        finally:
            self._raw.settimeout(_POLL)
        return data

    def _run(self) -> None:
        error: BaseException | None = None
        header = bytearray()
        remaining = 0
        stream = 1
        buf = bytearray(_RECV_SIZE)
        try:
            pending, self._pending = self._pending, b""
            self._raw.settimeout(_POLL)
            while not self.cancel.is_set():
                if pending:
                    data, pending = memoryview(pending), b""
                    n = len(data)
                else:
                    try:
                        n = self._raw.recv_into(buf)
                    except TimeoutError:
                        continue
                    except OSError:
                        break  # closed by cancel, or the engine went away
                    if n == 0:
                        break
                    data = memoryview(buf)[:n]
                pos = 0
                while pos < n:
                    if remaining == 0:
                        take = min(8 - len(header), n - pos)
                        header += data[pos : pos + take]
                        pos += take
                        if len(header) == 8:
                            stream = header[0]
                            remaining = int.from_bytes(header[4:8], "big")
                            header.clear()
                        continue
                    take = min(remaining, n - pos)
                    pos += take
                    remaining -= take
                    if self.delivered >= self._cap and not self._marker_pending:
                        self.truncated += take  # past the cap: count it, don't even copy it
                        continue
                    if not self._deliver(stream, bytes(data[pos - take : pos])):
                        return
        except BaseException as exc:  # reported to the consumer, never lost in a thread
            error = exc
        finally:
            self._channel.end(_End(error))

    def _deliver(self, stream: int, payload: bytes) -> bool:
        if stream == 2 and self._marker_pending:
            payload = self._take_marker(payload)
            if not payload:
                return True
        name = _STREAMS.get(stream)
        if name is None:
            return True  # stdin echo (0) never happens without a tty; ignore anything else
        room = self._cap - self.delivered
        if room <= 0:
            self.truncated += len(payload)
            return True
        if len(payload) > room:
            self.truncated += len(payload) - room
            payload = payload[:room]
        self.delivered += len(payload)
        return self._channel.put(OutputChunk(name, payload))

    def _take_marker(self, payload: bytes) -> bytes:
        self._marker_buf += payload
        if len(self._marker_buf) < len(PID_MARKER) and PID_MARKER.startswith(self._marker_buf):
            return b""  # the marker was split across frames; wait for more
        self._marker_pending = False
        buf, self._marker_buf = self._marker_buf, b""
        if not buf.startswith(PID_MARKER):
            return buf  # no wrapper (sh missing?): everything is output
        line, nl, rest = buf[len(PID_MARKER) :].partition(b"\n")
        if not nl:
            self._marker_pending = True
            self._marker_buf = buf
            return b""
        with contextlib.suppress(ValueError):
            self.pid = int(line)
        return rest


class _StdinWriter:
    def __init__(self, sock: Any, data: bytes, cancel: threading.Event) -> None:
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._data = data
        self._cancel = cancel
        self.thread = threading.Thread(target=self._run, name="forgehand-exec-stdin", daemon=True)

    def _run(self) -> None:
        view = memoryview(self._data)
        off = 0
        try:
            while off < len(view) and not self._cancel.is_set():
                try:
                    off += self._raw.send(view[off : off + _RECV_SIZE])
                except (TimeoutError, BlockingIOError):
                    continue
            # Half-close: the command sees end of input, its output keeps coming.
            self._raw.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the exec ended or was cancelled before reading all of its input


class ExecStream:
    """One running command. Iterate for `OutputChunk`s; then `result` (or `await wait()`).

    Use it as `async with sandbox.stream(argv) as s: async for chunk in s: ...`; leaving the block
    early kills the command. Up to `queue_chunks` chunks wait for the consumer (each at most one
    Docker frame, in practice 32 KiB) before the command is slowed down.
    """

    def __init__(
        self,
        sandbox: "Sandbox",
        argv: list[str],
        *,
        env: list[str] | None,
        cwd: str,
        stdin: bytes | None,
        timeout: float,
        output_cap: int,
        queue_chunks: int = 16,
        kill_grace: float = 5.0,
        keep_background: bool = False,
    ) -> None:
        self._keep_background = keep_background
        self._sb = sandbox
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self._stdin = stdin
        self._timeout = timeout
        self._cap = output_cap
        self._queue_chunks = queue_chunks
        self._kill_grace = kill_grace
        self._started = False
        self._done = False
        self._result: ExecResult | None = None
        self._exec_id = ""
        self._pump: _Pump | None = None
        self._sock: Any = None
        self._watchdog: asyncio.Task[None] | None = None
        self._timed_out = False
        self._t0 = 0.0
        self._t_end: float | None = None
        self._channel: _Channel | None = None

    async def __aenter__(self) -> "ExecStream":
        await self._begin()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> "ExecStream":
        return self

    async def __anext__(self) -> OutputChunk:
        if self._done:
            raise StopAsyncIteration
        await self._begin()
        assert self._channel is not None
        item = await self._channel.get()
        if isinstance(item, _End):
            self._t_end = time.monotonic()
            await self._finish(item)
            raise StopAsyncIteration
        return item

    @property
    def result(self) -> ExecResult:
        if self._result is None:
            raise RuntimeError("the command has not finished; iterate to the end or await wait()")
        return self._result

    async def wait(self) -> ExecResult:
        """Discard the rest of the output and return the result."""
        async for _ in self:
            pass
        return self.result

    async def aclose(self) -> None:
        """Kill the command if it is still running and release everything."""
        if self._done or not self._started:
            self._done = True
            return
        self._done = True
        if self._watchdog is not None:
            self._watchdog.cancel()
        exit_code = await self._exit_code(wait=False)
        if exit_code is None:  # still running (or unknown): the consumer went away, so it goes too
            await self._kill()
        if self._pump is not None:
            self._pump.cancel.set()
        if self._channel is not None:
            self._channel.abandoned.set()
        self._close_socket()
        self._result = ExecResult(
            exit_code=exit_code,
            timed_out=self._timed_out,
            oom_killed=False,
            truncated_bytes=self._pump.truncated if self._pump else 0,
            duration=time.monotonic() - self._t0,
        )

    async def _begin(self) -> None:
        if self._started:
            return
        self._started = True
        sb = self._sb
        # The in-container timeout fires a second after the host's, so the host's kill normally wins.
        inner = f"{self._timeout + 1:.3f}"
        keep = "1" if self._keep_background else "0"
        cmd = ["/bin/sh", "-c", WRAPPER, "forgehand-exec", inner, keep, *self._argv]
        self._t0 = time.monotonic()
        self._exec_id = await sb.engine_call(
            lambda c: c.api.exec_create(
                sb.id,
                cmd,
                stdout=True,
                stderr=True,
                stdin=self._stdin is not None,
                tty=False,
                user=sb.spec.user,
                environment=self._env,
                workdir=self._cwd,
            )["Id"],
            container=True,
        )
        self._sock = await sb.engine_call(
            lambda c: c.api.exec_start(self._exec_id, socket=True, tty=False), container=True
        )
        loop = asyncio.get_running_loop()
        self._channel = _Channel(loop, self._queue_chunks)
        self._pump = _Pump(self._sock, self._channel, self._cap)
        self._pump.take_prebuffered()
        # A stream dropped without aclose() must not leave its threads waiting for a reader.
        weakref.finalize(self, self._channel.abandoned.set)
        weakref.finalize(self, self._pump.cancel.set)
        self._pump.thread.start()
        if self._stdin is not None:
            _StdinWriter(self._sock, self._stdin, self._pump.cancel).thread.start()
        self._watchdog = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        await asyncio.sleep(max(0.0, self._t0 + self._timeout - time.monotonic()))
        self._timed_out = True
        await self._kill()
        # Give the output a moment to end after the kill; then stop reading whatever is left
        # (a process that slipped out of the kill and still holds the pipe).
        await asyncio.sleep(self._kill_grace)
        if self._pump is not None:
            self._pump.cancel.set()
        self._close_socket()

    async def _kill(self) -> None:
        pump = self._pump
        # The pid marker is the wrapper's first write; give it a moment if the kill came very early.
        for _ in range(10):
            if pump is None or pump.pid is not None:
                break
            await asyncio.sleep(0.05)
        if pump is None or pump.pid is None:
            return
        with contextlib.suppress(Exception):
            await self._sb.run_quiet(["/bin/sh", "-c", KILLER, "forgehand-kill", str(pump.pid)], timeout=10)

    def _close_socket(self) -> None:
        if self._sock is not None:
            # A SocketIO wrapper that the pump thread closed already has `_sock` None.
            raw = getattr(self._sock, "_sock", self._sock)
            if raw is not None:
                with contextlib.suppress(OSError):
                    raw.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self._sock.close()

    async def _finish(self, end: _End) -> None:
        self._done = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        self._close_socket()
        pump = self._pump
        assert pump is not None
        if end.error is not None and not self._timed_out:
            raise end.error
        exit_code = await self._exit_code()
        oom = False
        if exit_code in (137, None) or end.error is not None:
            oom = await self._sb.oom_happened()
        t_end = self._t_end if self._t_end is not None else time.monotonic()
        # Killed because the whole sandbox reached its wall clock (its idle process ended) is a
        # timeout too, even if the container went down a moment before our own timer fired.
        if exit_code in (137, None) and self._sb.remaining < 1.0 and not oom:
            self._timed_out = True
        self._result = ExecResult(
            exit_code=exit_code,
            timed_out=self._timed_out,
            oom_killed=oom,
            truncated_bytes=pump.truncated,
            duration=t_end - self._t0,
        )

    async def _exit_code(self, *, wait: bool = True) -> int | None:
        # The output can end a moment before the engine has recorded the exit.
        for _ in range(40 if wait else 1):
            try:
                info = await self._sb.engine_call(lambda c: c.api.exec_inspect(self._exec_id))
            except Exception:
                return None
            if not info.get("Running"):
                code = info.get("ExitCode")
                return int(code) if code is not None else None
            if self._timed_out:
                return None
            await asyncio.sleep(0.025)
        return None
