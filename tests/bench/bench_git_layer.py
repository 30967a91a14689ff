"""The git layer alone (no auth, no database): clone over smart HTTP through ``forge.git``
against ``git clone --no-local`` from the bare path, in the same run; and the peak memory of the
serving process while a 200 MB push and a 200 MB clone go through.

Run: ``make bench``. Goals (issue 3): clone time at most 1.5x the local clone; server memory flat
(under 100 MB above idle). The server is the asyncio test server of
``tests/integration/forge/git/test_git_smart_http.py``.
"""

import asyncio
import os
import time
from pathlib import Path

from forge.git import bare
from forge.git.names import repo_path
from forge.git.schemas import Identity
from tests.support.bench_repo import fast_import_history
from tests.support.git import Client, serve

FILES = 5000
COMMITS = 2000
BIG = 200 * 1024 * 1024


def _vm_hwm_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _reset_hwm() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _timed(client: Client, *args: str) -> float:
    start = time.perf_counter()
    await client.run(*args)
    return time.perf_counter() - start


async def test_clone_speed(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    path = repo_path(root, "bench", "big")
    bare.init_repo(path)
    fast_import_history(path, files=FILES, commits=COMMITS)
    client = Client(tmp_path / "home")
    async with serve(root, tmp_path) as server:
        http_times, local_times = [], []
        for i in range(3):
            local_times.append(await _timed(client, "clone", "-q", "--no-local", str(path), str(tmp_path / f"l{i}")))
            url = f"{server.url}/bench/big.git"
            http_times.append(await _timed(client, "clone", "-q", url, str(tmp_path / f"h{i}")))
    local, http = min(local_times), min(http_times)
    ratio = http / local
    print(f"\nclone of {FILES} files / {COMMITS} commits: local {local:.2f}s, smart HTTP {http:.2f}s")
    print(f"ratio {ratio:.2f} (goal <= 1.5)")
    assert server.errors == []


async def test_memory_of_big_push_and_clone(tmp_path: Path) -> None:
    root = tmp_path / "repos"
    path = repo_path(root, "bench", "huge")
    bare.init_repo(path, readme_author=Identity(name="B", email="b@example.com"))
    client = Client(tmp_path / "home")
    async with serve(root, tmp_path, mode="concurrent") as server:
        work = tmp_path / "work"
        await client.run("clone", "-q", f"{server.url}/bench/huge.git", str(work))
        with (work / "big.bin").open("wb") as fh:
            for _ in range(BIG // (1024 * 1024)):
                fh.write(os.urandom(1024 * 1024))
        await client.run("add", "big.bin", cwd=work)
        await client.run("commit", "-qm", "big", cwd=work)
        await asyncio.sleep(0.2)
        idle = _rss_kb()
        _reset_hwm()
        start = time.perf_counter()
        await client.run("push", "-q", "origin", "HEAD:main", cwd=work)
        push_s = time.perf_counter() - start
        push_peak = _vm_hwm_kb() - idle
        _reset_hwm()
        start = time.perf_counter()
        await client.run("clone", "-q", f"{server.url}/bench/huge.git", str(tmp_path / "clone"))
        clone_s = time.perf_counter() - start
        clone_peak = _vm_hwm_kb() - idle
    print(
        f"\n200 MB push {push_s:.1f}s, server peak +{push_peak / 1024:.1f} MB; "
        f"200 MB clone {clone_s:.1f}s, server peak +{clone_peak / 1024:.1f} MB (goal < 100 MB)"
    )
    assert server.errors == []
    assert push_peak < 100 * 1024 and clone_peak < 100 * 1024
