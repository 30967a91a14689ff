"""A folder page on a repository with many commits: the tree listing alone against the listing
plus each entry's last commit (one capped walk of the history) and README, through `RepoStore`
(the page's own path: pygit2 in a worker thread).

Run: ``make bench``. The repository has COMMITS commits over FILES files in 50 folders, and root
files untouched since the first commit (the worst case: the walk runs to its cap). Goal: the page
costs at most 3x libgit2's bare time-ordered walk of the same commits (the walk is the floor; on
a quiet machine a root page that walks the 5000-commit cap takes about 0.3 s).
"""

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pygit2
from pygit2.enums import SortMode

from forge.git import RepoStore, bare, list_tree
from forge.git.history import DEFAULT_MAX_WALK, tree_page
from tests.support.bench_repo import fast_import_history

FILES = 5000
COMMITS = 20_000


async def _best(runs: int, fn: Callable[[], Awaitable[object]]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        await fn()
        best = min(best, time.perf_counter() - start)
    return best


def _walk_only(repo: pygit2.Repository, count: int) -> int:
    """libgit2's time-ordered walk of ``count`` commits and nothing else: the floor of any walk."""
    head = repo.head.target
    return sum(1 for _, _commit in zip(range(count), repo.walk(head, SortMode.TIME), strict=False))


async def test_tree_page_with_last_commits(tmp_path: Path) -> None:
    store = RepoStore(tmp_path / "repos")
    key = ("bench", "big")
    path = store.path(key)
    bare.init_repo(path)
    fast_import_history(path, files=FILES, commits=COMMITS, root_files=("README.md", "LICENSE", "setup.cfg"))
    try:
        for folder in ("", "d7"):

            async def listing_only(folder: str = folder) -> object:
                return await store.read(key, list_tree, None, folder)

            async def full_page(folder: str = folder) -> object:
                return await store.read(key, tree_page, None, folder)

            page = await store.read(key, tree_page, None, folder)

            async def walk_only(count: int = page.last.walked) -> object:
                return await store.read(key, _walk_only, count)

            listing = await _best(5, listing_only)
            full = await _best(3, full_page)
            floor = await _best(3, walk_only)
            print(
                f"\n/{folder}: {len(page.listing.entries)} entries, listing {listing * 1000:.1f} ms, "
                f"with last commits {full * 1000:.1f} ms (ratio {full / listing:.0f} to the listing, "
                f"{full / floor:.1f} to a bare walk of the same commits, {floor * 1000:.1f} ms), "
                f"walked {page.last.walked} of {COMMITS} commits (cap {DEFAULT_MAX_WALK}), "
                f"{len(page.last.commits)} resolved, complete={page.last.complete}"
            )
            assert full < 3 * floor + 0.05
    finally:
        await store.close()
