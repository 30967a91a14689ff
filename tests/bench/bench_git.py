"""Git over smart HTTP against a real `forgehand serve`, measured against local baselines in the
same run:

- clone of a generated repository (5,000 files, 2,000 commits) over smart HTTP versus
  `git clone --no-local` from the bare path on disk (goal: at most 1.5x);
- peak server memory (RSS of the `forgehand serve` process) while a 200 MB push and a 200 MB
  clone go through (goal: flat, under 100 MB above idle).
"""

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))
FILES = 5000
COMMITS = 2000
BIG_BYTES = 200 * 1024 * 1024


def _env(tmp: Path, data: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update(
        FORGEHAND_DATA_DIR=str(data),
        FORGEHAND_PORT=str(port),
        FORGEHAND_SEED_DEMO="false",
        FORGEHAND_LOG_LEVEL="warning",
        HOME=str(tmp),
        GIT_AUTHOR_NAME="Bench",
        GIT_AUTHOR_EMAIL="bench@example.org",
        GIT_COMMITTER_NAME="Bench",
        GIT_COMMITTER_EMAIL="bench@example.org",
        GIT_TERMINAL_PROMPT="0",
    )
    return env


def _generate(path: Path, env: dict[str, str]) -> None:
    """A repository of FILES files built by COMMITS commits, with git fast-import (fast)."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(path)], check=True, env=env)
    lines: list[bytes] = []
    per_commit = FILES // COMMITS + 1
    n = 0
    for c in range(COMMITS):
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"committer Bench <bench@example.org> {1_700_000_000 + c} +0000\n".encode())
        msg = f"commit {c}\n".encode()
        lines.append(b"data %d\n%s" % (len(msg), msg))
        for _ in range(per_commit):
            if n >= FILES:
                break
            body = f"file {n}\n".encode() * 20
            lines.append(b"M 100644 inline src/d%03d/f%05d.txt\ndata %d\n%s\n" % (n % 100, n, len(body), body))
            n += 1
        body = f"revision {c}\n".encode()
        lines.append(b"M 100644 inline CHANGELOG\ndata %d\n%s\n" % (len(body), body))
    subprocess.run(["git", "-C", str(path), "fast-import", "--quiet"], input=b"".join(lines), check=True, env=env)


def _rss_kib(pid: int) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", text)
    return int(match.group(1)) if match else 0


class PeakSampler:
    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_kib(self.pid))
            time.sleep(0.02)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _best(n: int, fn: Callable[[], None]) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def test_bench_git(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = tmp_path / "data"
    env = _env(tmp_path, data, port)
    source = tmp_path / "source.git"
    _generate(source, env)

    def cli(*args: str) -> str:
        return subprocess.run([FORGEHAND, *args], env=env, check=True, capture_output=True, text=True).stdout

    cli("db", "upgrade")
    cli("users", "create", "bench", "--password", "correct horse battery")
    token = cli("tokens", "create", "--user", "bench", "--name", "b", "--scope", "repo:write").strip().splitlines()[-1]
    cli("repos", "import", str(source), "--owner", "bench", "--name", "big")
    server = subprocess.Popen([FORGEHAND, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        url = f"http://bench:{token}@127.0.0.1:{port}/bench/big.git"
        bare = data / "repos" / "bench" / "big.git"
        counter = iter(range(1000))

        def clone(src: str, *extra: str) -> None:
            dest = tmp_path / f"clone-{next(counter)}"
            subprocess.run(["git", "clone", "-q", *extra, src, str(dest)], env=env, check=True)

        local = _best(3, lambda: clone(str(bare), "--no-local"))
        http = _best(3, lambda: clone(url))
        print(
            f"\nclone of {FILES} files / {COMMITS} commits: smart HTTP {http:.2f} s,"
            f" git clone --no-local {local:.2f} s, ratio {http / local:.2f} (goal <= 1.5)"
        )

        # 200 MB push and clone: the server's memory must stay flat (streams, never buffers).
        httpx.post(
            f"{base}/api/v1/user/repos", json={"name": "blob"}, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ).raise_for_status()
        work = tmp_path / "blobwork"
        subprocess.run(["git", "init", "-q", "-b", "main", str(work)], env=env, check=True)
        with (work / "big.bin").open("wb") as fh:
            for _ in range(BIG_BYTES // (1 << 20)):
                fh.write(os.urandom(1 << 20))
        subprocess.run(["git", "-C", str(work), "add", "."], env=env, check=True)
        subprocess.run(["git", "-C", str(work), "commit", "-q", "-m", "big"], env=env, check=True)
        idle = _rss_kib(server.pid)
        blob_url = f"http://bench:{token}@127.0.0.1:{port}/bench/blob.git"
        with PeakSampler(server.pid) as push_peak:
            subprocess.run(["git", "-C", str(work), "push", "-q", blob_url, "main"], env=env, check=True)
        with PeakSampler(server.pid) as clone_peak:
            clone(blob_url)
        print(
            f"server RSS idle {idle / 1024:.0f} MB; peak above idle during a 200 MB push"
            f" {(push_peak.peak - idle) / 1024:.1f} MB, during a 200 MB clone {(clone_peak.peak - idle) / 1024:.1f} MB"
            " (goal < 100 MB)"
        )
    finally:
        server.terminate()
        server.wait(timeout=30)
