"""Raw file download: safe content types and headers, and streaming of big blobs.

A raw file is never served as HTML, SVG or anything a browser would run: text is
``text/plain; charset=utf-8``, a few image formats (recognised by their magic bytes, not by the
file name) keep their image type, everything else is ``application/octet-stream`` as an
attachment. Always with ``X-Content-Type-Options: nosniff`` and a sandboxing CSP.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import quote

import pygit2

from forge.git.errors import GitCommandFailed, RefNotFound
from forge.git.gitcmd import git_binary, git_env, terminate_process

SNIFF_BYTES = 8000
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"
BINARY_CONTENT_TYPE = "application/octet-stream"
DEFAULT_INLINE_LIMIT = 1024 * 1024
DEFAULT_CHUNK_SIZE = 64 * 1024
_FULL_SHA_RE = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}", re.ASCII)

_IMAGE_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)

#: For every raw response, whatever its type.
SAFE_RAW_HEADERS: dict[str, str] = {
    "X-Content-Type-Options": "nosniff",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
    "Cross-Origin-Resource-Policy": "same-origin",
    "X-Frame-Options": "DENY",
}


def is_binary_sample(data: bytes) -> bool:
    """git's rule: a NUL byte in the first 8000 bytes makes a file binary."""
    return b"\0" in data[:SNIFF_BYTES]


def safe_content_type(sample: bytes) -> str:
    """The content type to serve a blob with, from its first bytes (never from its name)."""
    for magic, content_type in _IMAGE_MAGIC:
        if sample.startswith(magic):
            return content_type
    if sample[:4] == b"RIFF" and sample[8:12] == b"WEBP":
        return "image/webp"
    if is_binary_sample(sample):
        return BINARY_CONTENT_TYPE
    return TEXT_CONTENT_TYPE


def _ascii_filename(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", name).strip("._") or "download"
    return cleaned[:200]


def raw_headers(name: str, content_type: str) -> dict[str, str]:
    """Response headers for a raw file called ``name`` served as ``content_type``."""
    disposition = "attachment" if content_type == BINARY_CONTENT_TYPE else "inline"
    headers = dict(SAFE_RAW_HEADERS)
    headers["Content-Type"] = content_type
    headers["Content-Disposition"] = (
        f"{disposition}; filename=\"{_ascii_filename(name)}\"; filename*=UTF-8''{quote(name, safe='')}"
    )
    return headers


def peek_blob(repo: pygit2.Repository, sha: str, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of a blob, without loading all of it (``git cat-file``)."""
    if not _FULL_SHA_RE.fullmatch(sha):
        raise RefNotFound(f"not a full object id: {sha!r}")
    argv = [git_binary(), f"--git-dir={repo.path}", "cat-file", "blob", sha]
    with subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=git_env()
    ) as proc:
        assert proc.stdout is not None
        data = proc.stdout.read(size)
        if proc.poll() is None:
            proc.kill()
    return data


async def stream_blob(repo_path: Path, sha: str, chunk_size: int = DEFAULT_CHUNK_SIZE) -> AsyncIterator[bytes]:
    """Yield the content of blob ``sha`` in chunks, with ``git cat-file`` (constant memory).

    Closing the generator early stops and reaps the git process.
    """
    if not _FULL_SHA_RE.fullmatch(sha):
        raise RefNotFound(f"not a full object id: {sha!r}")
    proc = await asyncio.create_subprocess_exec(
        git_binary(),
        f"--git-dir={repo_path}",
        "cat-file",
        "blob",
        sha,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=git_env(),
    )
    assert proc.stdout is not None and proc.stderr is not None
    try:
        while chunk := await proc.stdout.read(chunk_size):
            yield chunk
        stderr = await proc.stderr.read(4096)
        if await proc.wait() != 0:
            raise GitCommandFailed(
                f"git cat-file failed: {stderr.decode('utf-8', 'replace').strip()}",
                returncode=proc.returncode,
            )
    finally:
        await terminate_process(proc)
