"""Browsing real repositories built in the test."""

import os
import subprocess
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pygit2
import pytest

from forge.git import bare, browse, files
from forge.git.errors import InvalidPath, NotABlob, NotATree, PathNotFound, RefNotFound
from forge.git.names import repo_path
from forge.git.raw import stream_blob
from forge.git.schemas import Identity

ALICE = Identity(name="Alice", email="alice@example.com")
PNG = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR" + b"\0" * 20


@pytest.fixture
def empty(tmp_path: Path) -> pygit2.Repository:
    path = repo_path(tmp_path, "alice", "empty")
    bare.init_repo(path)
    return bare.open_repo(path)


@pytest.fixture
def repo(tmp_path: Path) -> pygit2.Repository:
    path = repo_path(tmp_path, "alice", "repo")
    bare.init_repo(path)
    repo = bare.open_repo(path)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    bare.write_commit(
        repo,
        branch="main",
        files={
            "README.md": "# Hello\n",
            "src/app.py": "print('hi')\n",
            "src/lib/util.py": "x = 1\n",
            "image.png": PNG,
            "page.html": "<script>alert(1)</script>\n",
            "logo.svg": '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
            "latin1.txt": "caf\xe9\n".encode("latin-1"),
            "link": "src/app.py",
        },
        modes={"link": 0o120000},
        message="initial\n\nwith a body",
        author=ALICE,
        when=t0,
    )
    bare.write_commit(
        repo,
        branch="main",
        files={"src/app.py": "print('hello')\n"},
        message="second",
        author=ALICE,
        when=t0 + timedelta(hours=1),
    )
    return repo


def test_empty_repository(empty: pygit2.Repository) -> None:
    assert browse.list_branches(empty) == []
    assert browse.list_tags(empty) == []
    assert browse.snapshot_refs(empty) == {}
    page = browse.log(empty)
    assert page.commits == [] and not page.has_next
    listing = files.list_tree(empty)
    assert listing.entries == [] and listing.commit_sha is None
    assert files.find_readme(empty) is None
    assert browse.head_commit(empty) is None
    with pytest.raises(RefNotFound):
        browse.resolve_ref(empty, "main")
    with pytest.raises(RefNotFound):
        browse.resolve_ref(empty, "HEAD")
    with pytest.raises(PathNotFound):
        files.read_blob(empty, None, "README.md")
    with pytest.raises(RefNotFound):
        browse.log(empty, "main")


def test_branches_and_tags(repo: pygit2.Repository) -> None:
    head = str(repo.revparse_single("main").id)
    first = str(repo.revparse_single("main~1").id)
    repo.references.create("refs/heads/feature", first)
    sig = pygit2.Signature("Tagger", "t@example.com", 1700000000, 60)
    repo.create_tag("v1.0", first, pygit2.enums.ObjectType.COMMIT, sig, "release 1.0\n")
    repo.references.create("refs/tags/light", head)
    blob = repo.create_blob(b"data")
    repo.references.create("refs/tags/blobtag", blob)
    branches = browse.list_branches(repo)
    assert [(b.name, b.is_default) for b in branches] == [("main", True), ("feature", False)]
    assert branches[0].commit is not None and branches[0].commit.summary == "second"
    tags = {t.name: t for t in browse.list_tags(repo)}
    assert tags["v1.0"].annotated and tags["v1.0"].sha == first and tags["v1.0"].message == "release 1.0\n"
    assert tags["v1.0"].tagger is not None and tags["v1.0"].tagger.time.utcoffset() == timedelta(hours=1)
    assert tags["v1.0"].commit is not None and tags["v1.0"].commit.sha == first
    assert not tags["light"].annotated and tags["light"].sha == head
    assert tags["blobtag"].target_type == "blob" and tags["blobtag"].commit is None
    refs = browse.snapshot_refs(repo)
    assert refs["refs/heads/main"] == head and refs["refs/heads/feature"] == first
    assert refs["refs/tags/blobtag"] == str(blob) and "HEAD" not in refs


def test_resolve(repo: pygit2.Repository) -> None:
    head = str(repo.revparse_single("main").id)
    first = str(repo.revparse_single("main~1").id)
    sig = pygit2.Signature("Tagger", "t@example.com")
    repo.create_tag("v1", first, pygit2.enums.ObjectType.COMMIT, sig, "v1")
    assert browse.resolve_ref(repo, "main").sha == head
    assert browse.resolve_ref(repo, "main").kind == "branch"
    assert browse.resolve_ref(repo, "refs/heads/main").sha == head
    resolved = browse.resolve_ref(repo, "v1")
    assert (resolved.kind, resolved.sha, resolved.ref) == ("tag", first, "refs/tags/v1")
    assert browse.resolve_ref(repo, head).kind == "commit"
    assert browse.resolve_ref(repo, head[:7]).sha == head
    assert browse.resolve_ref(repo, head.upper()).sha == head
    assert browse.resolve_ref(repo, "HEAD").sha == head
    for bad in ["nope", head[:6], "main~1", "main^", "HEAD@{0}", ":/second", "", "a" * 40, "refs/heads/x", "x\0"]:
        with pytest.raises(RefNotFound):
            browse.resolve_ref(repo, bad)
    tree_sha = str(repo.revparse_single("main").peel(pygit2.Tree).id)
    with pytest.raises(RefNotFound):
        browse.resolve_ref(repo, tree_sha)


def test_commit_info(repo: pygit2.Repository) -> None:
    info = browse.get_commit(repo, str(repo.revparse_single("main~1").id))
    assert info.summary == "initial"
    assert info.message == "initial\n\nwith a body"
    assert info.author.name == "Alice" and info.author.email == "alice@example.com"
    assert info.author.time == datetime(2024, 1, 1, tzinfo=UTC)
    assert info.parents == []
    assert info.short_sha == info.sha[:7]


def test_tree_listing(repo: pygit2.Repository) -> None:
    root = files.list_tree(repo)
    assert [(e.name, e.type) for e in root.entries] == [
        ("src", "tree"),
        ("image.png", "blob"),
        ("latin1.txt", "blob"),
        ("link", "symlink"),
        ("logo.svg", "blob"),
        ("page.html", "blob"),
        ("README.md", "blob"),
    ]
    readme = next(e for e in root.entries if e.name == "README.md")
    assert readme.size == 8 and readme.mode == "100644"
    src = files.list_tree(repo, "main", "src")
    assert [(e.path, e.size) for e in src.entries] == [("src/lib", None), ("src/app.py", 15)]
    assert files.list_tree(repo, "main", "src/lib/").path == "src/lib"
    with pytest.raises(NotATree):
        files.list_tree(repo, "main", "README.md")
    with pytest.raises(PathNotFound):
        files.list_tree(repo, "main", "nope")
    for bad in ["../x", "/etc", "src/../..", ".git", "a\0b"]:
        with pytest.raises(InvalidPath):
            files.list_tree(repo, "main", bad)


def test_submodule_entry(repo: pygit2.Repository) -> None:
    head = repo.revparse_single("main").peel(pygit2.Commit)
    builder = repo.TreeBuilder(head.tree)
    builder.insert("vendor", "c" * 40, pygit2.enums.FileMode.COMMIT)
    tree = builder.write()
    sig = pygit2.Signature("A", "a@example.com")
    repo.create_commit("refs/heads/main", sig, sig, "submodule", tree, [head.id])
    entry = next(e for e in files.list_tree(repo).entries if e.name == "vendor")
    assert (entry.type, entry.size, entry.mode) == ("commit", None, "160000")
    with pytest.raises(NotABlob):
        files.read_blob(repo, None, "vendor")


def test_read_blob(repo: pygit2.Repository) -> None:
    blob = files.read_blob(repo, "main", "src/app.py")
    assert blob.text == "print('hello')\n" and not blob.is_binary and not blob.truncated
    image = files.read_blob(repo, "main", "image.png")
    assert image.is_binary and image.text is None
    latin = files.read_blob(repo, "main", "latin1.txt")
    assert latin.text == "caf\ufffd\n"
    link = files.read_blob(repo, "main", "link")
    assert link.is_symlink and link.text == "src/app.py"
    with pytest.raises(NotABlob):
        files.read_blob(repo, "main", "src")
    with pytest.raises(PathNotFound):
        files.read_blob(repo, "main", "missing.txt")
    old = files.read_blob(repo, str(repo.revparse_single("main~1").id), "src/app.py")
    assert old.text == "print('hi')\n"


def test_read_blob_size_cap(repo: pygit2.Repository) -> None:
    blob = files.read_blob(repo, "main", "src/app.py", max_text_bytes=5)
    assert blob.truncated and blob.text is None and not blob.is_binary
    image = files.read_blob(repo, "main", "image.png", max_text_bytes=5)
    assert image.truncated and image.is_binary


def test_readme_detection(tmp_path: Path) -> None:
    for names, expected in [
        (["readme.txt", "README.md"], "README.md"),
        (["README", "readme.rst"], "readme.rst"),
        (["Readme.MD", "README"], "Readme.MD"),
        (["README"], "README"),
        (["READMEX.md", "docs.md"], None),
    ]:
        path = repo_path(tmp_path, "alice", f"r{len(list(tmp_path.rglob('HEAD')))}")
        bare.init_repo(path)
        repo = bare.open_repo(path)
        bare.write_commit(repo, branch="main", files={n: f"{n}\n" for n in names}, message="m", author=ALICE)
        readme = files.find_readme(repo)
        assert (readme.path if readme else None) == expected
    assert files.is_markdown("Readme.MD") and not files.is_markdown("README")


def test_raw_file_content_types(repo: pygit2.Repository) -> None:
    html = files.raw_file(repo, "main", "page.html")
    assert html.content_type == "text/plain; charset=utf-8"
    assert html.headers["X-Content-Type-Options"] == "nosniff"
    assert "sandbox" in html.headers["Content-Security-Policy"]
    assert html.data == b"<script>alert(1)</script>\n"
    svg = files.raw_file(repo, "main", "logo.svg")
    assert svg.content_type == "text/plain; charset=utf-8"
    png = files.raw_file(repo, "main", "image.png")
    assert png.content_type == "image/png"
    link = files.raw_file(repo, "main", "link")
    assert link.content_type.startswith("text/plain") and link.data == b"src/app.py"
    for raw in (html, svg, png, link):
        assert "html" not in raw.headers["Content-Type"] and "svg" not in raw.headers["Content-Type"]


async def test_huge_blob_is_streamed_not_loaded(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "big")
    bare.init_repo(path)
    size = 40 * 1024 * 1024
    data_file = tmp_path / "big.bin"
    with data_file.open("wb") as fh:
        fh.write(b"\0binary header")
        fh.write(os.urandom(1024) * (size // 1024 - 1))
    sha = (
        subprocess.run(
            ["git", f"--git-dir={path}", "hash-object", "-w", str(data_file)], capture_output=True, check=True
        )
        .stdout.decode()
        .strip()
    )
    repo = bare.open_repo(path)
    builder = repo.TreeBuilder()
    builder.insert("big.bin", sha, pygit2.enums.FileMode.BLOB)
    sig = pygit2.Signature("A", "a@example.com")
    repo.create_commit("refs/heads/main", sig, sig, "big", builder.write(), [])

    tracemalloc.start()
    try:
        info = files.read_blob(repo, "main", "big.bin")
        raw = files.raw_file(repo, "main", "big.bin")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.truncated and info.is_binary and info.text is None and info.size == data_file.stat().st_size
    assert raw.data is None and raw.content_type == "application/octet-stream"
    assert raw.headers["Content-Disposition"].startswith("attachment;")
    assert peak < 5 * 1024 * 1024

    total = 0
    largest = 0
    async for chunk in stream_blob(path, sha):
        total += len(chunk)
        largest = max(largest, len(chunk))
    assert total == info.size
    assert largest <= 64 * 1024


async def test_stream_blob_closed_early_and_bad_ids(tmp_path: Path, repo: pygit2.Repository) -> None:
    path = Path(repo.path)
    sha = files.read_blob(repo, "main", "README.md").sha
    chunks = [c async for c in stream_blob(path, sha, chunk_size=2)]
    assert b"".join(chunks) == b"# Hello\n"
    gen = stream_blob(path, sha, chunk_size=1)
    assert await gen.__anext__() == b"#"
    await gen.aclose()
    with pytest.raises(RefNotFound):
        async for _ in stream_blob(path, "main"):
            pass
    with pytest.raises(Exception, match="cat-file"):
        async for _ in stream_blob(path, "f" * 40):
            pass


def test_log_pagination_over_1000_commits(tmp_path: Path) -> None:
    path = repo_path(tmp_path, "alice", "long")
    bare.init_repo(path)
    repo = bare.open_repo(path)
    sig_time = 1_600_000_000
    builder = repo.TreeBuilder()
    parent: list[pygit2.Oid] = []
    for i in range(1000):
        blob = repo.create_blob(f"{i}\n".encode())
        builder.insert("counter.txt", blob, pygit2.enums.FileMode.BLOB)
        if i % 100 == 0:
            builder.insert(f"h{i}.txt", blob, pygit2.enums.FileMode.BLOB)
        tree = builder.write()
        sig = pygit2.Signature("A", "a@example.com", sig_time + i * 60, 0)
        oid = repo.create_commit(None, sig, sig, f"commit {i}", tree, parent)
        parent = [oid]
    repo.references.create("refs/heads/main", parent[0])

    first = browse.log(repo, per_page=50)
    assert [c.summary for c in first.commits[:2]] == ["commit 999", "commit 998"]
    assert first.has_next and len(first.commits) == 50
    last = browse.log(repo, page=20, per_page=50)
    assert last.commits[-1].summary == "commit 0" and not last.has_next
    beyond = browse.log(repo, page=21, per_page=50)
    assert beyond.commits == [] and not beyond.has_next
    seen = []
    page = 1
    while True:
        result = browse.log(repo, "main", page=page, per_page=100)
        seen += [c.sha for c in result.commits]
        if not result.has_next:
            break
        page += 1
    assert len(seen) == len(set(seen)) == 1000
    clamped = browse.log(repo, per_page=10_000, page=-3)
    assert clamped.per_page == 100 and clamped.page == 1
    touched = browse.log(repo, path="h500.txt", per_page=100)
    assert [c.summary for c in touched.commits] == ["commit 500"]
    assert len(browse.log(repo, path="counter.txt", per_page=100, page=10).commits) == 100
    with pytest.raises(InvalidPath):
        browse.log(repo, path="../x")
