"""Big repositories for benchmarks, written with `git fast-import` (seconds, not minutes)."""

import subprocess
from collections.abc import Sequence
from pathlib import Path


def fast_import_history(path: Path, *, files: int, commits: int, root_files: Sequence[str] = ()) -> None:
    """Write ``commits`` commits into the bare repository at ``path`` (branch main, one second
    apart): the first adds ``files`` files in 50 folders (``d0/`` .. ``d49/``) and ``root_files``
    at the root, each later one changes one file in a folder. Then ``git gc``."""
    lines: list[bytes] = []
    for i in range(commits):
        msg = f"commit {i}\n".encode()
        lines.append(b"commit refs/heads/main\n")
        lines.append(f"committer Bench <b@example.com> {1_600_000_000 + i} +0000\n".encode())
        lines.append(f"data {len(msg)}\n".encode() + msg)
        if i == 0:
            for name in root_files:
                body = f"{name}\n".encode()
                lines.append(f"M 100644 inline {name}\ndata {len(body)}\n".encode() + body)
            for f in range(files):
                body = f"file {f}\n".encode() * 20
                lines.append(f"M 100644 inline d{f % 50}/f{f}.txt\ndata {len(body)}\n".encode() + body)
        else:
            f = (i * 7) % files
            body = f"file {f} change {i}\n".encode() * 20
            lines.append(f"M 100644 inline d{f % 50}/f{f}.txt\ndata {len(body)}\n".encode() + body)
        lines.append(b"\n")
    subprocess.run(["git", f"--git-dir={path}", "fast-import", "--quiet"], input=b"".join(lines), check=True)
    subprocess.run(["git", f"--git-dir={path}", "gc", "--quiet"], check=True)
