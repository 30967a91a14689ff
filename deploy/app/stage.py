"""Prepare the application image's build context from this checkout and its virtualenv, offline.

    python deploy/app/stage.py hash             # the recipe hash (what the image's label records)
    python deploy/app/stage.py stage CONTEXT    # fill CONTEXT (emptied first), print the hash

Run it with the virtualenv's interpreter (`.venv/bin/python`): the dependencies are the runtime
closure of forgehand's own requirements (no `dev` extra) as installed there, copied file by file
from each distribution's RECORD (their wheels are CPython 3.11 manylinux builds, which load under
Debian bookworm's python3 3.11). forgehand itself is copied as source with a minimal dist-info
(name, version, entry points): the virtualenv's setuptools is too old to build its wheel and nothing
can be downloaded. The recipe hash covers the Dockerfile, the dependency versions and forgehand's
files, so an unchanged recipe reuses the image (deploy/scripts/build-app-image).
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

try:
    from packaging.requirements import Requirement
except ImportError:  # pragma: no cover - pip always vendors it
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
RECIPE_FILES = ("Dockerfile", "stage.py")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def project() -> dict[str, Any]:
    project: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project


def dependency_closure() -> list[metadata.Distribution]:
    """forgehand's runtime requirements and theirs, as installed in this interpreter's environment."""
    seen: dict[str, metadata.Distribution] = {}
    todo = [(Requirement(r), "") for r in project()["dependencies"]]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = _canonical(req.name)
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            sys.exit(f"stage: {req.name} (needed by forgehand) is not installed in {sys.prefix}")
        first = name not in seen
        seen[name] = dist
        # Each requested extra adds its own requirements (litestar[jinja] -> jinja2).
        for wanted in ["", *sorted(req.extras)] if first else sorted(req.extras):
            for sub in dist.requires or []:
                todo.append((Requirement(sub), wanted))
    return sorted(seen.values(), key=lambda d: _canonical(d.metadata["Name"]))


def package_files() -> list[Path]:
    """forgehand's own files (what its wheel would hold): tracked and new, not ignored, no tests."""
    include = tuple(p.rstrip("*") for p in ("forge*", "tasks*", "sandbox*", "webhooks*", "egress*"))
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *include],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout.decode()
    files = []
    for rel in sorted(set(filter(None, out.split("\0")))):
        path = ROOT / rel
        if path.is_file() and "__pycache__" not in path.parts and not rel.endswith(".pyc"):
            files.append(Path(rel))
    return files


def recipe_hash(deps: list[metadata.Distribution], files: list[Path]) -> str:
    h = hashlib.sha256()
    for name in RECIPE_FILES:
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    for d in deps:
        h.update(f"{_canonical(d.metadata['Name'])}=={d.version}\n".encode())
    for rel in files:
        h.update(str(rel).encode() + b"\0" + (ROOT / rel).read_bytes() + b"\0")
    return h.hexdigest()[:24]


def _copy_distribution(dist: metadata.Distribution, site: Path) -> int:
    n = 0
    for f in dist.files or []:
        rel = Path(str(f))
        if rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue  # console scripts (bin/) and bytecode: not needed, the image compiles its own
        src = Path(str(f.locate()))
        if not src.is_file():
            continue
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        n += 1
    return n


def stage(context: Path) -> str:
    deps = dependency_closure()
    files = package_files()
    digest = recipe_hash(deps, files)
    if context.exists():
        shutil.rmtree(context)
    site = context / "site-packages"
    site.mkdir(parents=True)
    for d in deps:
        _copy_distribution(d, site)
    for rel in files:
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dst)
    proj = project()
    info = site / f"forgehand-{proj['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: forgehand\nVersion: {proj['version']}\nSummary: {proj['description']}\n"
    )
    scripts = "".join(f"{k} = {v}\n" for k, v in proj["scripts"].items())
    (info / "entry_points.txt").write_text(f"[console_scripts]\n{scripts}")
    (info / "INSTALLER").write_text("forgehand deploy/app/stage.py\n")
    (info / "RECORD").write_text("")
    (context / "requirements.lock").write_text(
        "".join(f"{_canonical(d.metadata['Name'])}=={d.version}\n" for d in deps)
    )
    shutil.copy2(HERE / "Dockerfile", context / "Dockerfile")
    return digest


def main(argv: list[str]) -> None:
    if argv[:1] == ["hash"] and len(argv) == 1:
        print(recipe_hash(dependency_closure(), package_files()))
    elif argv[:1] == ["stage"] and len(argv) == 2:
        print(stage(Path(argv[1]).resolve()))
    elif argv[:1] == ["version"] and len(argv) == 1:
        print(project()["version"])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
