"""``RepoStore``: pygit2 work off the event loop, writes serialized per repository.

pygit2 calls block, so they run in a thread pool. Reads run concurrently. Writes to one
repository (commits, ref updates, create, rename, delete, import) take that repository's
``asyncio.Lock`` first, so they run one at a time in this process; git's own lock files protect
against other processes (receive-pack, other replicas).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Concatenate, ParamSpec, TypeVar

import pygit2

from forge.git import bare
from forge.git.names import owner_path, repo_path
from forge.git.schemas import Identity

P = ParamSpec("P")
T = TypeVar("T")
RepoName = tuple[str, str]


def _with_repo(path: Path, fn: Callable[..., T], args: tuple[object, ...], kwargs: dict[str, object]) -> T:
    repo = bare.open_repo(path)
    try:
        return fn(repo, *args, **kwargs)
    finally:
        repo.free()


class RepoStore:
    """The repositories under ``root`` (``<root>/<owner>/<name>.git``)."""

    def __init__(self, root: Path, *, max_workers: int = 8) -> None:
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="forgehand-git")
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def path(self, name: RepoName) -> Path:
        """The validated, traversal-proof directory of ``(owner, name)``."""
        return repo_path(self.root, name[0], name[1])

    def exists(self, name: RepoName) -> bool:
        return (self.path(name) / "HEAD").is_file()

    def lock(self, name: RepoName) -> asyncio.Lock:
        """The write lock of one repository (by path: case-insensitive like the names)."""
        key = str(self.path(name))
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    @contextlib.asynccontextmanager
    async def _locked(self, *names: RepoName) -> AsyncIterator[None]:
        locks = {str(self.path(n)): self.lock(n) for n in names}
        async with contextlib.AsyncExitStack() as stack:
            for key in sorted(locks):  # always the same order: no deadlock between two renames
                await stack.enter_async_context(locks[key])
            yield

    async def _run(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def read(
        self,
        name: RepoName,
        fn: Callable[Concatenate[pygit2.Repository, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(repo, *args, **kwargs)`` in a worker thread, on a freshly opened repository."""
        return await self._run(_with_repo, self.path(name), fn, args, kwargs)

    async def write(
        self,
        name: RepoName,
        fn: Callable[Concatenate[pygit2.Repository, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """Like ``read``, holding the repository's write lock."""
        path = self.path(name)
        async with self._locked(name):
            return await self._run(_with_repo, path, fn, args, kwargs)

    async def write_path(
        self,
        name: RepoName,
        fn: Callable[Concatenate[Path, P], T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(path, *args, **kwargs)`` in a worker thread under the write lock (for
        operations on the directory itself)."""
        path = self.path(name)
        async with self._locked(name):
            return await self._run(fn, path, *args, **kwargs)

    # --- repository lifecycle ---------------------------------------------------------------

    async def create(
        self,
        name: RepoName,
        *,
        default_branch: str = "main",
        description: str | None = None,
        readme_author: Identity | None = None,
    ) -> str | None:
        """Create ``owner/name``, empty or with a README commit (returns its sha)."""
        return await self.write_path(
            name,
            bare.init_repo,
            default_branch=default_branch,
            description=description,
            readme_author=readme_author,
            readme_title=name[1],
        )

    async def import_from(self, name: RepoName, source: str) -> None:
        """Import every branch and tag of a repository on this machine (path or file:// URL)."""
        await self.write_path(name, bare.import_repo, source)

    async def rename(self, old: RepoName, new: RepoName) -> None:
        old_path, new_path = self.path(old), self.path(new)
        async with self._locked(old, new):
            await self._run(bare.rename_repo, old_path, new_path)

    async def rename_owner(self, old_owner: str, new_owner: str) -> None:
        """Move every repository of an account whose login changed."""
        old_dir, new_dir = owner_path(self.root, old_owner), owner_path(self.root, new_owner)
        await self._run(bare.rename_owner, old_dir, new_dir)

    async def delete(self, name: RepoName) -> None:
        await self.write_path(name, bare.delete_repo)

    async def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=False)
