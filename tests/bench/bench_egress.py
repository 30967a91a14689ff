"""The egress proxy's cost: a 50 MB download from a local server through the proxy against the same
download made directly on the host, and the latency an allowed CONNECT adds.

Three processes, as in a run: the origin server (its own process), the proxy (this process, as in
the worker), the client (its own process, standing in for the sandbox: it talks to the proxy's
Unix socket; the relay in the container is the same kind of byte pump and is not measured here).
The client reads with 1 MiB buffers and times each transfer.

- Download: plain HTTP (absolute-form through the proxy) and HTTPS-style (a CONNECT tunnel, the
  bytes inside unparsed), each against direct TCP; goal: throughput at least 0.8x direct.
- CONNECT latency: from sending the CONNECT to the first byte of the origin's answer through the
  tunnel, against a direct TCP connect and the same exchange; goal: p50 added at most 5 ms.

Printed as ratios and milliseconds measured in the same run, never asserted as wall-clock limits;
correctness (every byte arrived, every connection counted) is asserted. Run: `make bench`.
"""

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from egress import AllowedHosts, Dialer, EgressProxy, RuleSet

SIZE = 50 * 1024 * 1024
DOWNLOADS = 7  # per path, alternating
CONNECTS = 200

ORIGIN = """
import socket, sys, threading
size = int(sys.argv[1])
body = bytes(range(256)) * (size // 256)
head = b"HTTP/1.1 200 OK\\r\\ncontent-length: %d\\r\\nconnection: close\\r\\n\\r\\n" % len(body)
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(128)
print(srv.getsockname()[1], flush=True)
def serve(conn):
    with conn:
        data = b""
        while b"\\r\\n\\r\\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        if data.startswith(b"GET /small"):
            conn.sendall(b"HTTP/1.1 200 OK\\r\\ncontent-length: 2\\r\\nconnection: close\\r\\n\\r\\nok")
        else:
            conn.sendall(head)
            conn.sendall(body)
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

CLIENT = """
import json, socket, sys, time
mode, target, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
buf = bytearray(1 << 20)

def connect():
    if target.startswith("/"):
        s = socket.socket(socket.AF_UNIX); s.connect(target)
    else:
        s = socket.create_connection((target, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s

def read_answer(s):
    # The head, then exactly content-length bytes: a proxy keeps the client's connection open.
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += s.recv(65536)
    head, _, rest = data.partition(b"\\r\\n\\r\\n")
    length = int([l.split(b":")[1] for l in head.lower().split(b"\\r\\n") if l.startswith(b"content-length:")][0])
    n = len(rest)
    while n < length:
        got = s.recv_into(buf)
        if not got:
            break
        n += got
    return n

def head(s):
    data = b""
    while b"\\r\\n\\r\\n" not in data:
        data += s.recv(1)
    return data

out = []
for _ in range(count):
    t0 = time.perf_counter()
    s = connect()
    if mode == "direct":
        s.sendall(b"GET /big HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n\\r\\n" % port)
    elif mode == "http":
        s.sendall(b"GET http://127.0.0.1:%d/big HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n\\r\\n" % (port, port))
    elif mode == "connect":
        s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n\\r\\n" % (port, port))
        assert head(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /big HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n\\r\\n" % port)
    elif mode in ("direct-rtt", "connect-rtt"):
        if mode == "connect-rtt":
            s.sendall(b"CONNECT 127.0.0.1:%d HTTP/1.1\\r\\nHost: 127.0.0.1:%d\\r\\n\\r\\n" % (port, port))
            assert head(s).startswith(b"HTTP/1.1 200")
        s.sendall(b"GET /small HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        s.recv(1)
        out.append((time.perf_counter() - t0, 1))
        s.close()
        continue
    n = read_answer(s)
    out.append((time.perf_counter() - t0, n))
    s.close()
print(json.dumps(out))
"""


@contextmanager
def origin() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", ORIGIN, str(SIZE)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=10)


async def client(mode: str, target: str, port: int, count: int) -> list[tuple[float, int]]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLIENT, mode, target, str(port), str(count), stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0, f"the {mode} client failed"
    return [(float(t), int(n)) for t, n in json.loads(out)]


def p50(values: list[float]) -> float:
    return statistics.median(values)


async def measure() -> None:
    with origin() as port, tempfile.TemporaryDirectory(prefix="fh-bench-", dir="/tmp") as tmp:
        sock = Path(tmp) / "egress.sock"
        proxy = EgressProxy(sock, RuleSet.build([f"127.0.0.1:{port}"]), Dialer(AllowedHosts.parse("127.0.0.1")))
        await proxy.start()
        try:
            times: dict[str, list[float]] = {"direct": [], "http": [], "connect": []}
            for _ in range(DOWNLOADS):  # alternating, so drift of the machine hits every path alike
                for mode in times:
                    target = "127.0.0.1" if mode == "direct" else str(sock)
                    [(seconds, got)] = await client(mode, target, port, 1)
                    assert got == SIZE, f"{mode}: {got} bytes"
                    times[mode].append(seconds)
            rtt_direct = [t for t, _ in await client("direct-rtt", "127.0.0.1", port, CONNECTS)]
            rtt_proxy = [t for t, _ in await client("connect-rtt", str(sock), port, CONNECTS)]
            assert proxy.stats.allowed == 2 * DOWNLOADS + CONNECTS and proxy.stats.blocked == 0
        finally:
            await proxy.close()
    mb = SIZE / 1e6
    direct, fastest = p50(times["direct"]), min(times["direct"])
    print(f"\n50 MB download, {DOWNLOADS} each: direct {mb / direct:,.0f} MB/s median, {mb / fastest:,.0f} best")
    for mode, label in (("http", "plain HTTP through the proxy"), ("connect", "CONNECT tunnel")):
        ratio, best = direct / p50(times[mode]), fastest / min(times[mode])
        speed = mb / p50(times[mode])
        print(f"  {label}: {speed:,.0f} MB/s = {ratio:.2f}x direct (median; best {best:.2f}x; goal >= 0.8x)")
    added = (p50(rtt_proxy) - p50(rtt_direct)) * 1000
    print(
        f"CONNECT + first byte, {CONNECTS} each: direct p50 {p50(rtt_direct) * 1000:.2f} ms, "
        f"through the proxy p50 {p50(rtt_proxy) * 1000:.2f} ms: +{added:.2f} ms (goal <= 5 ms)"
    )


def test_egress_proxy_throughput_and_connect_latency() -> None:
    asyncio.run(measure())
