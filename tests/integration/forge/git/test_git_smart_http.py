"""git smart HTTP with the real git client against a tiny HTTP server on 127.0.0.1.

The server below is test scaffolding only: raw asyncio HTTP/1.1 (Content-Length and chunked
request bodies, chunked responses, one request per connection) that routes to the framework-free
functions of ``forge.git``. The web application wires the same functions into Litestar.
"""

from __future__ import annotations

import asyncio
import gzip
import os
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from forge.git import bare
from forge.git.errors import PushTooLarge
from forge.git.hooks import install_hooks
from forge.git.names import repo_path
from forge.git.pktline import FLUSH_PKT, iter_pkt_lines, pkt_line
from forge.git.refrules import ProtectionRule, PushContext, RefUpdate
from forge.git.schemas import Identity
from forge.git.service_process import run_service
from forge.git.smart_http import GitHttpConfig, advertise_refs
from tests.support.git import Client, Server, pack_objects, serve
from tests.support.waiting import until

ALICE = Identity(name="Alice", email="alice@example.com")


def bare_git(path: Path, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={path}", *args], capture_output=True, check=True).stdout.decode()


def ref_of(path: Path, ref: str) -> str | None:
    proc = subprocess.run(["git", f"--git-dir={path}", "rev-parse", "--verify", "-q", ref], capture_output=True)
    return proc.stdout.decode().strip() or None


def quarantines(path: Path) -> list[str]:
    """The object directories a push under way receives into."""
    return [p.name for p in (path / "objects").iterdir() if p.name.startswith(("tmp_objdir", "incoming-"))]


def assert_intact(path: Path) -> None:
    subprocess.run(["git", f"--git-dir={path}", "fsck", "--no-progress"], check=True, capture_output=True)
    leftovers = quarantines(path)
    assert leftovers == []


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "repos"


@pytest.fixture
def client(tmp_path: Path) -> Client:
    return Client(tmp_path / "client-home")


@pytest.fixture
def seeded(root: Path) -> Path:
    path = repo_path(root, "alice", "proj")
    bare.init_repo(path, readme_author=ALICE, description="demo")
    return path


# --- tests ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["concurrent", "buffered"])
async def test_clone_push_fetch_roundtrip(root: Path, tmp_path: Path, client: Client, mode: str) -> None:
    path = repo_path(root, "alice", "empty")
    bare.init_repo(path)
    async with serve(root, tmp_path, mode=mode) as server:
        work = tmp_path / "work"
        result = await client.run("clone", f"{server.url}/alice/empty.git", str(work))
        assert "empty repository" in result.output
        sha = await client.commit(work, "hello.txt", "hello\n", "first")
        await client.run("push", "origin", "HEAD:refs/heads/main", cwd=work)
        assert ref_of(path, "refs/heads/main") == sha
        assert server.pushes == [[RefUpdate(old="0" * 40, new=sha, ref="refs/heads/main")]]

        sha2 = await client.commit(work, "hello.txt", "hello again\n", "second")
        await client.run("push", "origin", "HEAD:main", "HEAD:refs/heads/feature", cwd=work)
        assert ref_of(path, "refs/heads/main") == sha2
        assert ref_of(path, "refs/heads/feature") == sha2
        assert {u.ref: (u.old, u.new) for u in server.pushes[-1]} == {
            "refs/heads/main": (sha, sha2),
            "refs/heads/feature": ("0" * 40, sha2),
        }

        other = tmp_path / "other"
        await client.run("clone", f"{server.url}/alice/empty.git", str(other))
        assert (other / "hello.txt").read_text() == "hello again\n"
        sha3 = await client.commit(work, "more.txt", "x" * 100_000, "third")
        await client.run("push", "origin", "HEAD:main", cwd=work)
        await client.run("fetch", "origin", cwd=other)
        assert (await client.run("rev-parse", "origin/main", cwd=other)).output.strip() == sha3
    assert server.errors == []
    assert all(p.returncode is not None for p in server.processes)
    assert_intact(path)


@pytest.mark.parametrize("version", ["0", "1", "2"])
async def test_protocol_versions_and_shallow_clone(
    root: Path, seeded: Path, tmp_path: Path, client: Client, version: str
) -> None:
    async with serve(root, tmp_path) as server:
        work = tmp_path / "work"
        await client.run("-c", f"protocol.version={version}", "clone", f"{server.url}/alice/proj.git", str(work))
        await client.commit(work, "a.txt", "a", "a")
        await client.commit(work, "b.txt", "b", "b")
        await client.run("push", "origin", "HEAD:main", cwd=work)
        shallow = tmp_path / "shallow"
        result = await client.run(
            "-c", f"protocol.version={version}", "clone", "--depth", "1", f"{server.url}/alice/proj.git", str(shallow)
        )
        assert (shallow / "b.txt").exists()
        count = (await client.run("rev-list", "--count", "HEAD", cwd=shallow)).output.strip()
        assert count == "1", result.output
        trace = await client.run("-c", f"protocol.version={version}", "ls-remote", f"{server.url}/alice/proj.git")
        assert "refs/heads/main" in trace.output
    assert server.errors == []


async def test_protocol_v2_is_spoken(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path) as server:
        client.env["GIT_TRACE_PACKET"] = "1"
        result = await client.run("-c", "protocol.version=2", "ls-remote", f"{server.url}/alice/proj.git")
        assert "version 2" in result.output and "ls-refs" in result.output
        del client.env["GIT_TRACE_PACKET"]


async def _clone_and_commit(client: Client, server: Server, tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    await client.run("clone", f"{server.url}/alice/proj.git", str(work))
    return work


async def test_force_push_to_protected_branch_is_refused_in_the_hook(
    root: Path, seeded: Path, tmp_path: Path, client: Client
) -> None:
    before = ref_of(seeded, "refs/heads/main")
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        await client.run("commit", "--amend", "-qm", "rewritten", cwd=work)
        result = await client.run("push", "--force", "origin", "HEAD:main", cwd=work, check=False)
        assert result.returncode != 0
        assert "remote: forgehand: refusing refs/heads/main: protected branch: force-push refused" in result.output
        assert "[remote rejected] HEAD -> main (pre-receive hook declined)" in result.output
        assert ref_of(seeded, "refs/heads/main") == before
        # the same push to another branch is fine
        await client.run("push", "--force", "origin", "HEAD:refs/heads/scratch", cwd=work)
    assert server.pushes and server.pushes[-1][0].ref == "refs/heads/scratch"
    assert_intact(seeded)
    # the refused commit did not get into the repository: the quarantine was dropped
    objects = bare_git(seeded, "cat-file", "--batch-all-objects", "--batch-check")
    assert len(objects.splitlines()) == 3 + 1  # README commit, tree, blob + the rewritten commit (via scratch)


async def test_force_push_to_existing_commit_is_refused_before_git_runs(
    root: Path, seeded: Path, tmp_path: Path, client: Client
) -> None:
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        first = ref_of(seeded, "refs/heads/main")
        await client.commit(work, "x.txt", "x", "x")
        await client.run("push", "origin", "HEAD:main", cwd=work)
        await client.run("reset", "-q", "--hard", "HEAD~1", cwd=work)
        result = await client.run("push", "--force", "origin", "HEAD:main", cwd=work, check=False)
        assert result.returncode != 0
        assert "[remote rejected] HEAD -> main (protected branch: force-push refused)" in result.output
        assert "remote: forgehand: refusing refs/heads/main" in result.output
        assert ref_of(seeded, "refs/heads/main") != first


@pytest.mark.parametrize("mode", ["concurrent", "buffered"])
async def test_deleting_protected_branch_is_refused(
    root: Path, seeded: Path, tmp_path: Path, client: Client, mode: str
) -> None:
    async with serve(root, tmp_path, mode=mode) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        result = await client.run("push", "origin", "--delete", "main", cwd=work, check=False)
        assert result.returncode != 0
        assert "[remote rejected] main (protected branch: deletion refused)" in result.output
        assert ref_of(seeded, "refs/heads/main") is not None
        await client.run("push", "origin", "HEAD:refs/heads/tmp", cwd=work)
        await client.run("push", "origin", "--delete", "tmp", cwd=work)
        assert ref_of(seeded, "refs/heads/tmp") is None
    assert server.errors == []


async def test_agent_branches_are_reserved(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        await client.commit(work, "x.txt", "x", "x")
        result = await client.run(
            "push", "origin", "HEAD:refs/heads/agent/task-1", "HEAD:refs/heads/ok", cwd=work, check=False
        )
        assert result.returncode != 0
        assert (
            "[remote rejected] HEAD -> agent/task-1 (agent/* branches are reserved for forgehand tasks)"
            in result.output
        )
        assert "[remote rejected] HEAD -> ok (push refused: another ref in this push was refused)" in result.output
        assert ref_of(seeded, "refs/heads/agent/task-1") is None and ref_of(seeded, "refs/heads/ok") is None
        server.contexts["alice/proj"] = PushContext(default_branch="main", is_admin=True)
        await client.run("push", "origin", "HEAD:refs/heads/agent/task-1", cwd=work)
        assert ref_of(seeded, "refs/heads/agent/task-1") is not None


async def test_confusing_ref_names_are_refused(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        for ref, why in [
            ("refs/heads/HEAD", "'HEAD' is not a branch or tag name"),
            ("refs/tags/head", "'head' is not a branch or tag name"),
            ("refs/heads/Agent/task-1", "agent/* branches are reserved for forgehand tasks"),
        ]:
            result = await client.run("push", "origin", f"HEAD:{ref}", cwd=work, check=False)
            assert result.returncode != 0 and why in result.output, result.output
            assert ref_of(seeded, ref) is None


async def test_archived_repository_refuses_pushes(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path) as server:
        server.contexts["alice/proj"] = PushContext(default_branch="main", archived=True, is_admin=True)
        work = await _clone_and_commit(client, server, tmp_path)
        await client.commit(work, "x.txt", "x", "x")
        result = await client.run("push", "origin", "HEAD:main", cwd=work, check=False)
        assert "(repository is archived (read-only))" in result.output
        assert result.returncode != 0
        # clones still work
        await client.run("clone", f"{server.url}/alice/proj.git", str(tmp_path / "again"))


async def test_pattern_protection_and_tags(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path) as server:
        server.contexts["alice/proj"] = PushContext(
            default_branch="main", rules=[ProtectionRule(pattern="release/*"), ProtectionRule(pattern="refs/tags/v*")]
        )
        work = await _clone_and_commit(client, server, tmp_path)
        await client.run("tag", "v1", cwd=work)
        await client.run("push", "origin", "v1", "HEAD:refs/heads/release/1", cwd=work)
        result = await client.run("push", "origin", "--delete", "v1", cwd=work, check=False)
        assert "(protected tag: deletion refused)" in result.output
        await client.commit(work, "y", "y", "y")
        await client.run("push", "origin", "HEAD:release/1", cwd=work)  # fast-forward is fine
        await client.run("commit", "--amend", "-qm", "changed", cwd=work)
        result = await client.run("push", "-f", "origin", "HEAD:release/1", cwd=work, check=False)
        assert "protected branch: force-push refused" in result.output and result.returncode != 0


async def _raw_post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    status = int(data.split(b" ", 2)[1])
    raw = data.split(b"\r\n\r\n", 1)[1]
    if b"chunked" in data.split(b"\r\n\r\n", 1)[0].lower():
        out = bytearray()
        while raw:
            size_line, _, raw = raw.partition(b"\r\n")
            size = int(size_line, 16)
            if size == 0:
                break
            out += raw[:size]
            raw = raw[size + 2 :]
        raw = bytes(out)
    return status, raw


def _commands(old: str, new: str, ref: str) -> bytes:
    return pkt_line(f"{old} {new} {ref}\0report-status side-band-64k agent=test\n") + FLUSH_PKT


def _pack_for(path: Path, work: Path, rev: str, base: str) -> bytes:
    return pack_objects(work, rev, base)


@pytest.mark.parametrize("kind", ["garbage", "truncated", "empty", "bad-object"])
async def test_bad_packs_leave_the_repository_intact(
    root: Path, seeded: Path, tmp_path: Path, client: Client, kind: str
) -> None:
    before = bare_git(seeded, "for-each-ref")
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        base = ref_of(seeded, "refs/heads/main")
        assert base is not None
        new = await client.commit(work, "big.bin", os.urandom(200_000), "big")
        pack = _pack_for(seeded, work, new, base)
        if kind == "garbage":
            pack = b"PACK" + os.urandom(5000)
        elif kind == "truncated":
            pack = pack[: len(pack) // 2]
        elif kind == "empty":
            pack = b""
        else:  # a well-formed pack whose commit is broken (fsck must catch it)
            bad = (
                subprocess.run(
                    ["git", "hash-object", "-t", "commit", "-w", "--literally", "--stdin"],
                    cwd=work,
                    input=b"tree 0000000000000000000000000000000000000000\nauthor x\n\nbad\n",
                    capture_output=True,
                    check=True,
                )
                .stdout.decode()
                .strip()
            )
            pack = subprocess.run(
                ["git", "pack-objects", "--stdout", "-q"],
                cwd=work,
                input=f"{bad}\n".encode(),
                capture_output=True,
                check=True,
            ).stdout
            new = bad
        status, body = await _raw_post(
            server.port, "/alice/proj.git/git-receive-pack", _commands(base, new, "refs/heads/main") + pack
        )
        assert status == 200
        report = b"".join(p[1:] for p in iter_pkt_lines(body) if p and p[:1] == b"\x01")
        assert b"ng refs/heads/main unpacker error" in report and b"unpack ok" not in report
        if kind == "bad-object":
            messages = b"".join(p[1:] for p in iter_pkt_lines(body) if p and p[:1] == b"\x02")
            assert b"missingEmail" in messages and b"fsck error in packed object" in messages
    assert bare_git(seeded, "for-each-ref") == before
    assert server.pushes == []
    assert_intact(seeded)


async def test_garbage_command_list_is_a_protocol_error(root: Path, seeded: Path, tmp_path: Path) -> None:
    async with serve(root, tmp_path) as server:
        status, body = await _raw_post(server.port, "/alice/proj.git/git-receive-pack", b"zzzz not pkt lines")
        assert status == 400 and b"pkt-line" in body
    assert_intact(seeded)


@pytest.mark.parametrize("mode", ["concurrent", "buffered"])
async def test_oversized_push_is_refused(root: Path, seeded: Path, tmp_path: Path, client: Client, mode: str) -> None:
    config = GitHttpConfig(hooks_dir=install_hooks(tmp_path / "hooks"), max_request_bytes=64 * 1024)
    before = bare_git(seeded, "for-each-ref")
    async with serve(root, tmp_path, config=config, mode=mode) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        await client.commit(work, "big.bin", os.urandom(1024 * 1024), "big")
        result = await client.run("push", "origin", "HEAD:main", cwd=work, check=False)
        assert result.returncode != 0
        assert "HTTP 413" in result.output
    assert [type(e) for e in server.errors] == [PushTooLarge]
    assert bare_git(seeded, "for-each-ref") == before
    assert_intact(seeded)


async def test_client_disconnect_mid_push(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    before = bare_git(seeded, "for-each-ref")
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        base = ref_of(seeded, "refs/heads/main")
        assert base is not None
        new = await client.commit(work, "big.bin", os.urandom(2_000_000), "big")
        pack = _pack_for(seeded, work, new, base)
        body = _commands(base, new, "refs/heads/main") + pack
        _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = f"POST /alice/proj.git/git-receive-pack HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body[: len(body) // 3])
        await writer.drain()
        await until(lambda: quarantines(seeded), timeout=30, what="receive-pack to start taking the pack")
        writer.transport.abort()
        await until(lambda: not quarantines(seeded), timeout=30, what="the aborted push's quarantine to go")
    assert bare_git(seeded, "for-each-ref") == before
    assert server.pushes == []
    assert_intact(seeded)


async def test_client_disconnect_mid_clone_reaps_git(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    async with serve(root, tmp_path, mode="buffered") as server:
        work = await _clone_and_commit(client, server, tmp_path)
        await client.commit(work, "big.bin", os.urandom(8_000_000), "big")
        await client.run("push", "origin", "HEAD:main", cwd=work)
        want = ref_of(seeded, "refs/heads/main")
        request = pkt_line(f"want {want} side-band-64k ofs-delta\n") + FLUSH_PKT + pkt_line("done\n")
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        head = f"POST /alice/proj.git/git-upload-pack HTTP/1.1\r\nHost: x\r\nContent-Length: {len(request)}\r\n\r\n"
        writer.write(head.encode() + request)
        await writer.drain()
        await reader.read(1000)  # the response started
        writer.transport.abort()
        await until(
            lambda: all(p.returncode is not None for p in server.processes), timeout=30, what="git to be reaped"
        )
        assert server.processes and all(p.returncode is not None for p in server.processes)


async def test_gzip_request_body(root: Path, seeded: Path, tmp_path: Path) -> None:
    request = pkt_line("command=ls-refs\n") + b"0001" + pkt_line("ref-prefix refs/heads/\n") + FLUSH_PKT
    async with serve(root, tmp_path) as server:
        status, body = await _raw_post(
            server.port,
            "/alice/proj.git/git-upload-pack",
            gzip.compress(request),
            {"Content-Encoding": "gzip", "Git-Protocol": "version=2"},
        )
        assert status == 200
        assert b"refs/heads/main" in body
        status, _ = await _raw_post(server.port, "/alice/proj.git/git-upload-pack", b"xx", {"Content-Encoding": "br"})
        assert status == 415


async def test_git_client_gzips_big_negotiations(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    """A fetch with many "have" lines makes the git client gzip its request body."""
    async with serve(root, tmp_path) as server:
        work = await _clone_and_commit(client, server, tmp_path)
        for i in range(40):
            await client.commit(work, f"f{i}.txt", str(i), f"local {i}")
        other = tmp_path / "other"
        await client.run("clone", f"{server.url}/alice/proj.git", str(other))
        await client.commit(other, "remote.txt", "r", "remote")
        await client.run("push", "origin", "HEAD:main", cwd=other)
        client.env["GIT_TRACE_CURL"] = "1"
        client.env["GIT_TRACE_CURL_NO_DATA"] = "1"
        result = await client.run("-c", "protocol.version=0", "fetch", "origin", cwd=work)
        assert server.errors == []
        assert "gzip" in result.output.lower()


async def test_advertisement_prefix(root: Path, seeded: Path) -> None:
    v0 = b"".join([c async for c in advertise_refs("git-upload-pack", seeded)])
    assert v0.startswith(b"001e# service=git-upload-pack\n0000")
    v2 = b"".join([c async for c in advertise_refs("git-upload-pack", seeded, "version=2")])
    assert v2.startswith(b"000eversion 2\n")
    rp = b"".join([c async for c in advertise_refs("git-receive-pack", seeded, "version=2")])
    assert rp.startswith(b"001f# service=git-receive-pack\n0000")
    assert b"report-status" in rp


async def test_hook_fails_closed_without_push_context(root: Path, seeded: Path, tmp_path: Path, client: Client) -> None:
    hooks = install_hooks(tmp_path / "hooks")
    work = tmp_path / "work"
    await client.run("clone", str(seeded), str(work))
    base = ref_of(seeded, "refs/heads/main")
    assert base is not None
    new = await client.commit(work, "x", "x", "x")
    body = _commands(base, new, "refs/heads/main") + _pack_for(seeded, work, new, base)

    async def once() -> AsyncIterator[bytes]:
        yield body

    out = b"".join(
        [c async for c in run_service("git-receive-pack", seeded, once(), config=GitHttpConfig(hooks_dir=hooks))]
    )
    assert b"did not come through forgehand" in out
    assert ref_of(seeded, "refs/heads/main") == base
    assert_intact(seeded)
