"""A repository to browse, made the way people make them: commits written with the `git` CLI
(fixed dates, two authors, a branch merged with --no-ff, an annotated tag, a binary and a huge
file, a submodule, a folder with its own README, a README with hostile HTML) and pushed with `git push`.

`build_history(work)` returns the commit ids by name so tests can assert which commit a page
names; `push_to(work, bare_path)` pushes every branch and tag into a bare repository."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support.git import git

#: 2024-01-01 00:00 UTC; commit N is N days later.
T0 = 1_704_067_200
DAY = 86_400

HOSTILE_README = """# Browse me

Some *markdown* and a [safe link](https://example.org/).

<script>window.__owned = 1</script>
<iframe src="https://evil.example/"></iframe>
<a href="javascript:alert(1)">click</a>
<img src="x" alt="a picture" onerror="window.__owned = 2">
"""

HUGE_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class History:
    work: Path
    initial: str
    app_changed: str
    docs_added: str
    feature: str
    merge: str
    big_files: str

    @property
    def head(self) -> str:
        return self.big_files


def _commit(work: Path, message: str, day: int, *, author: str = "Ana <ana@example.org>") -> str:
    name, _, email = author.partition(" <")
    when = f"{T0 + day * DAY} +0000"
    env = {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email.rstrip(">"),
        "GIT_AUTHOR_DATE": when,
        "GIT_COMMITTER_DATE": when,
    }
    git("commit", "-q", "-m", message, cwd=work, env=env)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def _write(work: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        target = work / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content, encoding="utf-8")
        git("add", rel, cwd=work)


def build_history(work: Path) -> History:
    work.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "-b", "main", cwd=work)
    _write(
        work,
        {
            "README.md": HOSTILE_README,
            "LICENSE": "MIT\n",
            "src/app.py": 'def main():\n    return "hi"\n\n\nprint(main())\n',
            "src/lib/util.py": "X = 1\n",
            "docs/README.md": "# The docs folder\n\nRead *these*.\n",
        },
    )
    initial = _commit(work, "Initial import", 0)
    _write(work, {"src/app.py": 'def main():\n    return "hello"\n\n\nprint(main())\n'})
    app_changed = _commit(work, "Say hello", 1, author="Bob <bob@example.org>")
    _write(work, {"docs/guide.md": "# Guide\n"})
    docs_added = _commit(work, "Add the guide", 2)
    git("tag", "-a", "v1.0", "-m", "first release", app_changed, cwd=work)
    git("switch", "-q", "-c", "feature/x", cwd=work)
    _write(work, {"src/app.py": 'def main():\n    return "hello, world"\n\n\nprint(main())\n'})
    feature = _commit(work, "Greet the world", 3, author="Bob <bob@example.org>")
    git("switch", "-q", "main", cwd=work)
    env = {"GIT_AUTHOR_DATE": f"{T0 + 4 * DAY} +0000", "GIT_COMMITTER_DATE": f"{T0 + 4 * DAY} +0000"}
    git("merge", "-q", "--no-ff", "-m", "Merge feature/x", "feature/x", cwd=work, env=env)
    merge = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    _write(work, {"assets/logo.bin": bytes(range(256)) * 8, "assets/huge.txt": ("x" * 99 + "\n") * (HUGE_BYTES // 100)})
    # A submodule entry (a gitlink: mode 160000 naming a commit of another repository).
    git("update-index", "--add", "--cacheinfo", f"160000,{initial},vendor/lib", cwd=work)
    big_files = _commit(work, "Add assets", 5)
    return History(work, initial, app_changed, docs_added, feature, merge, big_files)


def push_to(work: Path, bare: Path) -> None:
    """`git push` every branch and tag into the bare repository at ``bare``."""
    git("push", "-q", str(bare), "refs/heads/*:refs/heads/*", "refs/tags/*:refs/tags/*", cwd=work)


def last_change(work: Path, path: str, ref: str = "main") -> str:
    """What `git log -1 -- path` says: the independent answer the forge's own walk must match."""
    return git("log", "-1", "--format=%H", ref, "--", path, cwd=work).stdout.strip()


def path_log(work: Path, path: str, ref: str = "main") -> list[str]:
    return git("log", "--format=%H", ref, "--", path, cwd=work).stdout.split()
