"""A folder page on a repository with many commits: the tree listing alone against the listing
plus each entry's last commit (one capped walk of the history) and README, through `RepoStore`
(the page's own path: pygit2 in a worker thread).

Run: ``make bench``. The repository has COMMITS commits over FILES files in 50 folders, and root
files untouched since the first commit (the worst case: the walk runs to its cap). Goal: a root
page and a folder page each within 0.5 s with the cap at its default (5000 commits).
"""

import subprocess
import time
from pathlib import Path

from forge.git import RepoStore, list_tree
from forge.git.history import DEFAULT_MAX_WALK, tree_page

FILES = 5000
COMMITS = 20_000


def _generate(path: Path) -> None:
    lines: list[bytes] = []
    for i in range(COMMITS):
        msg = f"commit {i}\n".encode()
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"committer Bench <b@example.com> {1_600_000_000 + i} +0000\n".encode())
        lines.append(f"data {len(msg)}\n".encode() + msg)
        if i == 0:
            for name in ("README.md", "LICENSE", "setup.cfg"):
                body = f"{name}\n".encode()
                lines.append(f"M 100644 inline {name}\ndata {len(body)}\n".encode() + body)
            for f in range(FILES):
                body = f"file {f}\n".encode() * 20
                lines.append(f"M 100644 inline d{f % 50}/f{f}.txt\ndata {len(body)}\n".encode() + body)
        else:
            f = (i * 7) % FILES
            body = f"file {f} change {i}\n".encode() * 20
            lines.append(f"M 100644 inline d{f % 50}/f{f}.txt\ndata {len(body)}\n".encode() + body)
        lines.append(b"\n")
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    subprocess.run(["git", f"--git-dir={path}", "fast-import", "--quiet"], input=b"".join(lines), check=True)
    subprocess.run(["git", f"--git-dir={path}", "symbolic-ref", "HEAD", "refs/heads/main"], check=True)
    subprocess.run(["git", f"--git-dir={path}", "gc", "--quiet"], check=True)


async def _best(runs: int, fn: object) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        await fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


async def test_tree_page_with_last_commits(tmp_path: Path) -> None:
    store = RepoStore(tmp_path / "repos")
    key = ("bench", "big")
    _generate(store.path(key))
    try:
        for folder in ("", "d7"):
            listing = await _best(5, lambda folder=folder: store.read(key, list_tree, None, folder))
            full = await _best(3, lambda folder=folder: store.read(key, tree_page, None, folder))
            page = await store.read(key, tree_page, None, folder)
            resolved = len(page.last.commits)
            print(
                f"\n/{folder}: {len(page.listing.entries)} entries, listing {listing * 1000:.1f} ms, "
                f"with last commits {full * 1000:.1f} ms (ratio {full / listing:.1f}), "
                f"walked {page.last.walked} of {COMMITS} commits (cap {DEFAULT_MAX_WALK}), "
                f"{resolved} resolved, complete={page.last.complete}"
            )
            assert full < 0.5
    finally:
        await store.close()
