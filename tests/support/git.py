"""Git test pieces: the `git` CLI helpers (`git`, `Client`), a scripted smart-HTTP server on the
git layer alone (`serve`), trees built byte for byte (names libgit2 would refuse included), the
leaves of a tree or a work tree, and `git fsck --strict`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pygit2
from pygit2.enums import FileMode, ObjectType

from forge.git.errors import GitProtocolError, PushTooLarge, RepoError, UnsupportedEncoding
from forge.git.hooks import install_hooks
from forge.git.names import repo_path
from forge.git.push import PushSession
from forge.git.refrules import PushContext, RefUpdate
from forge.git.service_process import GitServiceProcess, run_service
from forge.git.smart_http import (
    NO_CACHE_HEADERS,
    GitHttpConfig,
    advertise_refs,
    advertisement_content_type,
    decode_request_body,
    result_content_type,
)


def git(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base_env = {
        **os.environ,
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(cwd or Path.cwd()),
        "GIT_AUTHOR_NAME": "Ana",
        "GIT_AUTHOR_EMAIL": "ana@example.org",
        "GIT_COMMITTER_NAME": "Ana",
        "GIT_COMMITTER_EMAIL": "ana@example.org",
    }
    result = subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**base_env, **(env or {})},
        timeout=120,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


# --- the test server ------------------------------------------------------------------------------


@dataclass
class Server:
    root: Path
    config: GitHttpConfig
    #: "concurrent": run_service / PushSession.stream; "buffered": feed the body first.
    mode: str = "concurrent"
    contexts: dict[str, PushContext] = field(default_factory=dict)
    pushes: list[list[RefUpdate]] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    port: int = 0
    processes: list[GitServiceProcess] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except BaseException as exc:  # recorded for the test to look at
            self.errors.append(exc)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = (await reader.readline()).decode()
        if not request_line:
            return
        method, target, _ = request_line.split(" ", 2)
        headers: dict[str, str] = {}
        while (line := (await reader.readline()).decode()) not in ("\r\n", "\n", ""):
            key, _, value = line.partition(":")
            headers[key.strip().lower()] = value.strip()
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = self._body(reader, headers)
        parts = urlsplit(target)
        owner, _, rest = parts.path.lstrip("/").partition("/")
        name, _, action = rest.partition(".git/")
        path = repo_path(self.root, owner, name)
        protocol = headers.get("git-protocol")
        if method == "GET" and action == "info/refs":
            service = parse_qs(parts.query)["service"][0]
            await self._respond(writer, advertisement_content_type(service), advertise_refs(service, path, protocol))
            return
        if method != "POST" or action not in ("git-upload-pack", "git-receive-pack"):
            await self._status(writer, 404, b"not found")
            return
        try:
            decoded = decode_request_body(
                body, headers.get("content-encoding"), max_bytes=self.config.max_request_bytes
            )
        except UnsupportedEncoding:
            await self._status(writer, 415, b"unsupported encoding")
            return
        if action == "git-upload-pack":
            if self.mode == "buffered":
                proc = await GitServiceProcess.start(action, path, git_protocol=protocol, config=self.config)
                self.processes.append(proc)
                await proc.feed(decoded)
                output = proc.output()
            else:
                output = run_service(action, path, decoded, protocol, config=self.config)
            await self._respond(writer, result_content_type(action), output)
            return
        ctx = self.contexts.get(f"{owner}/{name}", PushContext(default_branch="main"))
        try:
            push = await PushSession.open(path, decoded, ctx, config=self.config, git_protocol=protocol)
        except GitProtocolError as exc:
            await self._status(writer, 400, str(exc).encode())
            return
        try:
            if push.refused:
                await push.discard_rest()
                await self._respond(writer, result_content_type(action), _once(push.rejection()))
                return
            if self.mode == "buffered":
                try:
                    proc = await push.start()
                except PushTooLarge as exc:
                    self.errors.append(exc)
                    await self._status(writer, 413, b"too large", reader)
                    return
                self.processes.append(proc)
                output = proc.output()
            else:
                output = push.stream()
            await self._respond(writer, result_content_type(action), output, reader)
            accepted = push.accepted()
            if accepted:
                self.pushes.append(accepted)
        finally:
            push.close()

    def _body(self, reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
        async def chunked() -> AsyncIterator[bytes]:
            while True:
                size = int((await reader.readline()).split(b";")[0].strip(), 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass
                    return
                remaining = size
                while remaining:
                    data = await reader.read(min(remaining, 65536))
                    if not data:
                        raise ConnectionError("client went away")
                    remaining -= len(data)
                    yield data
                await reader.readline()

        async def sized(length: int) -> AsyncIterator[bytes]:
            while length:
                data = await reader.read(min(length, 65536))
                if not data:
                    raise ConnectionError("client went away")
                length -= len(data)
                yield data

        if headers.get("transfer-encoding", "").lower() == "chunked":
            return chunked()
        return sized(int(headers.get("content-length", "0")))

    async def _status(
        self, writer: asyncio.StreamWriter, status: int, text: bytes, reader: asyncio.StreamReader | None = None
    ) -> None:
        writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: text/plain\r\nContent-Length: {len(text)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + text
        )
        await writer.drain()
        if reader is not None:  # a lingering close, as HTTP servers do: let the client read the answer
            writer.write_eof()
            with contextlib.suppress(TimeoutError, ConnectionError):
                async with asyncio.timeout(5):
                    while await reader.read(65536):
                        pass

    async def _respond(
        self,
        writer: asyncio.StreamWriter,
        content_type: str,
        body: AsyncIterator[bytes],
        reader: asyncio.StreamReader | None = None,
    ) -> None:
        iterator = aiter(body)
        try:
            first = await anext(iterator, b"")
        except PushTooLarge as exc:
            self.errors.append(exc)
            await self._status(writer, 413, b"too large", reader)
            return
        except RepoError as exc:
            self.errors.append(exc)
            await self._status(writer, 400, str(exc).encode())
            return
        head = ["HTTP/1.1 200 OK", f"Content-Type: {content_type}", "Transfer-Encoding: chunked", "Connection: close"]
        head += [f"{k}: {v}" for k, v in NO_CACHE_HEADERS.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
        try:
            chunk = first
            while True:
                if chunk:
                    writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
                    await writer.drain()
                chunk = await anext(iterator, None)
                if chunk is None:
                    break
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                await iterator.aclose()  # type: ignore[attr-defined]


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


@contextlib.asynccontextmanager
async def serve(root: Path, tmp_path: Path, **kwargs: object) -> AsyncIterator[Server]:
    hooks = install_hooks(tmp_path / "hooks")
    config = kwargs.pop("config", None) or GitHttpConfig(hooks_dir=hooks)
    server = Server(root=root, config=config, **kwargs)  # type: ignore[arg-type]
    srv = await asyncio.start_server(server.handle, "127.0.0.1", 0)
    server.port = srv.sockets[0].getsockname()[1]
    try:
        yield server
    finally:
        srv.close()
        await srv.wait_closed()


# --- the git client -------------------------------------------------------------------------------


@dataclass
class Result:
    returncode: int
    output: str


class Client:
    def __init__(self, home: Path) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home = home
        self.env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "Bob",
            "GIT_AUTHOR_EMAIL": "bob@example.com",
            "GIT_COMMITTER_NAME": "Bob",
            "GIT_COMMITTER_EMAIL": "bob@example.com",
            "LC_ALL": "C",
        }

    async def run(self, *args: str, cwd: Path | None = None, check: bool = True) -> Result:
        proc = await asyncio.create_subprocess_exec(
            "git", *args, cwd=cwd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        out, _ = await proc.communicate()
        result = Result(proc.returncode or 0, out.decode("utf-8", "replace"))
        if check and result.returncode != 0:
            raise AssertionError(f"git {' '.join(args)} failed:\n{result.output}")
        return result

    async def commit(self, work: Path, name: str, content: str | bytes, message: str) -> str:
        target = work / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
        await self.run("add", "-A", cwd=work)
        await self.run("commit", "-qm", message, cwd=work)
        return (await self.run("rev-parse", "HEAD", cwd=work)).output.strip()


# --- trees ----------------------------------------------------------------------------------------


TREE, BLOB, EXEC, LINK, GITLINK = 0o040000, 0o100644, 0o100755, 0o120000, 0o160000

# A leaf as the tests describe it: (mode, content) with content the blob's bytes (a symlink's
# target) or, for a submodule link, the commit id in hex.
Leaf = tuple[int, bytes]


def write_tree(repo: pygit2.Repository, leaves: dict[str, Leaf]) -> pygit2.Oid:
    """A tree holding `leaves` (paths with `/`), serialized by hand so that any name goes in."""
    children: dict[str, dict[str, Leaf]] = {}
    entries: dict[bytes, tuple[int, pygit2.Oid]] = {}
    for path, (mode, content) in leaves.items():
        head, sep, rest = path.partition("/")
        if sep:
            children.setdefault(head, {})[rest] = (mode, content)
        elif mode == GITLINK:
            entries[os.fsencode(head)] = (mode, pygit2.Oid(hex=content.decode()))
        else:
            entries[os.fsencode(head)] = (mode, repo.create_blob(content))
    for name, sub in children.items():
        entries[os.fsencode(name)] = (TREE, write_tree(repo, sub))

    def order(name: bytes) -> bytes:
        return name + b"/" if entries[name][0] == TREE else name

    raw = b"".join(b"%o %s\x00%s" % (entries[n][0], n, entries[n][1].raw) for n in sorted(entries, key=order))
    return repo.odb.write(ObjectType.TREE, raw)


def commit_tree(repo: pygit2.Repository, leaves: dict[str, Leaf], branch: str = "main") -> str:
    sig = pygit2.Signature("Ana", "ana@example.com", 1_700_000_000, 0)
    oid = repo.create_commit(f"refs/heads/{branch}", sig, sig, "base", write_tree(repo, leaves), [])
    return str(oid)


def fast_import(repo_path: Path, files: dict[str, bytes], branch: str = "main") -> str:
    """One commit holding `files`, written as a pack by `git fast-import` (many files, quickly)."""
    out = [b"commit refs/heads/%s\ncommitter Ana <ana@example.com> 1700000000 +0000\ndata 4\nbase\n" % branch.encode()]
    for path, data in files.items():
        out.append(b"M 100644 inline %s\ndata %d\n%s\n" % (path.encode(), len(data), data))
    subprocess.run(
        ["git", f"--git-dir={repo_path}", "fast-import", "--quiet"], input=b"".join(out), check=True, timeout=300
    )
    return subprocess.run(
        ["git", f"--git-dir={repo_path}", "rev-parse", branch], capture_output=True, text=True, check=True
    ).stdout.strip()


def tree_entries(repo: pygit2.Repository, sha: str) -> dict[str, tuple[int, pygit2.Oid]]:
    """Every non-tree entry of the commit's tree: path -> (mode, id)."""
    out: dict[str, tuple[int, pygit2.Oid]] = {}

    def walk(tree: pygit2.Tree, prefix: str) -> None:
        for entry in tree:
            path = prefix + os.fsdecode(entry.raw_name or b"")
            if entry.filemode == FileMode.TREE:
                walk(repo[entry.id].peel(pygit2.Tree), path + "/")
            else:
                out[path] = (int(entry.filemode), entry.id)

    walk(repo[sha].peel(pygit2.Commit).tree, "")
    return out


def work_leaves(root: Path) -> dict[str, Leaf]:
    """The files and symlinks of a work tree: path -> (mode as git would record it, content)."""
    out: dict[str, Leaf] = {}
    for dirpath, dirnames, filenames in os.walk(os.fsencode(root)):
        rel = os.path.relpath(dirpath, os.fsencode(root))
        for name in [*filenames, *[d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]]:
            full = os.path.join(dirpath, name)
            path = os.fsdecode(name if rel == b"." else os.path.join(rel, name))
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[path] = (LINK, os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as fh:
                    out[path] = (EXEC if st.st_mode & 0o100 else BLOB, fh.read())
    return out


def pack_objects(work: Path, rev: str, base: str) -> bytes:
    """The pack a push of `rev` over `base` sends, built in the clone `work`."""
    return subprocess.run(
        ["git", "pack-objects", "--stdout", "--revs", "-q"],
        cwd=work,
        input=f"{rev}\n^{base}\n".encode(),
        capture_output=True,
        check=True,
    ).stdout


def fsck_strict(repo_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", f"--git-dir={repo_path}", "fsck", "--strict", "--no-dangling", "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
