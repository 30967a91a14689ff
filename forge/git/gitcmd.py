"""Running the ``git`` binary with a minimal, predictable environment.

Nothing from the server's environment leaks into git except ``PATH``: no ``GIT_DIR``, no
``GIT_*`` overrides, no system or user configuration (``GIT_CONFIG_NOSYSTEM=1``, ``HOME`` is an
empty private directory), no prompts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

from forge.git.errors import GitCommandFailed

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_home_lock = threading.Lock()
_home: Path | None = None


def git_binary() -> str:
    """The absolute path of ``git`` (resolved once per call from ``PATH``)."""
    found = shutil.which("git")
    if found is None:
        raise GitCommandFailed("the git binary was not found on PATH")
    return found


def empty_home() -> Path:
    """A private, empty directory used as ``HOME`` for every git subprocess of this process."""
    global _home
    with _home_lock:
        if _home is None or not _home.is_dir():
            _home = Path(tempfile.mkdtemp(prefix="forgehand-git-home-"))
        return _home


def git_env(extra: Mapping[str, str] | None = None, *, home: Path | None = None) -> dict[str, str]:
    """The environment for a git subprocess: minimal, plus ``extra``."""
    env = {
        "PATH": os.environ.get("PATH", _DEFAULT_PATH),
        "HOME": str(home if home is not None else empty_home()),
        "LANG": "C",
        "LC_ALL": "C",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "GIT_PROTOCOL_FROM_USER": "0",
    }
    if extra:
        env.update(extra)
    return env


def run_git(
    args: Sequence[str],
    *,
    cwd: Path | None = None,
    env_extra: Mapping[str, str] | None = None,
    config: Mapping[str, str] | None = None,
    input: bytes | None = None,
    timeout: float | None = 600,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``git [-c k=v ...] args`` synchronously and return the completed process."""
    argv = [git_binary()]
    for key, value in (config or {}).items():
        argv += ["-c", f"{key}={value}"]
    argv += list(args)
    proc = subprocess.run(
        argv,
        cwd=cwd,
        env=git_env(env_extra),
        input=input,
        stdin=None if input is not None else subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        stderr = proc.stderr.decode("utf-8", "replace").strip()
        raise GitCommandFailed(
            f"git {args[0] if args else ''} failed ({proc.returncode}): {stderr[-2000:]}",
            returncode=proc.returncode,
            stderr=stderr,
        )
    return proc


async def terminate_process(proc: asyncio.subprocess.Process, *, grace: float = 2.0) -> int:
    """Stop ``proc`` if it still runs (SIGTERM, then SIGKILL after ``grace`` seconds) and reap it.

    SIGTERM first lets git remove its lock files and quarantine directory.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    return await proc.wait()
