"""Building the sandbox image: the Dockerfile recipe, or the offline debootstrap recipe.

`build_image` is what `forgehand sandbox build` and the test session fixture call. It is idempotent:
an image already tagged with the current recipe version is left alone unless `force` is set.
The recipe texts live here (not only under deploy/) so that an installed package can build without
the source tree; deploy/sandbox/ holds identical copies for operators, and a unit test keeps them equal.
"""

import contextlib
import io
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

import docker
import docker.errors
from rich.console import Console

from sandbox.errors import ImageBuildFailed

from .building import BuildResult, Reporter, connect, stream_build
from .names import DEFAULT_IMAGE as DEFAULT_IMAGE
from .names import IMAGE_REPOSITORY as IMAGE_REPOSITORY
from .names import IMAGE_VERSION as IMAGE_VERSION

# IMAGE_VERSION (names.py): bump it when any recipe text below changes.
BASE_IMAGE = f"{IMAGE_REPOSITORY}-base:bookworm-{IMAGE_VERSION}"
VERSION_LABEL = "org.forgehand.sandbox.version"
RECIPE_LABEL = "org.forgehand.sandbox.recipe"
# curl and pip: a task whose repository allows egress fetches through the proxy (HTTP(S)_PROXY).
PACKAGES = ("bash", "coreutils", "git", "python3", "python3-pip", "curl", "ripgrep", "ca-certificates")
DEBIAN_MIRROR = "http://deb.debian.org/debian"
PULL_BASE = "debian:bookworm-slim"

Recipe = Literal["auto", "dockerfile", "offline"]

# The part both recipes share: the user, the workspace, no setuid/setgid bits, the labels.
_COMMON = (
    f"ARG FORGEHAND_SANDBOX_VERSION={IMAGE_VERSION}\n"
    + """\
RUN groupadd --gid 1000 agent \\
 && useradd --uid 1000 --gid 1000 --home-dir /home/agent --create-home --shell /bin/bash agent \\
 && mkdir -p /workspace \\
 && chown 1000:1000 /workspace \\
 && chmod 0755 /workspace \\
 && find / -xdev -type f -perm /6000 -exec chmod ug-s {} + \\
 && rm -rf /var/cache/apt/archives/*.deb /var/lib/apt/lists/* /var/log/apt /var/log/dpkg.log
ENV HOME=/home/agent USER=agent LANG=C.UTF-8 \\
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
LABEL org.forgehand.sandbox.version=$FORGEHAND_SANDBOX_VERSION \\
      org.opencontainers.image.title="forgehand sandbox" \\
      org.opencontainers.image.description="Debian bookworm with bash, coreutils, git, python3, pip, curl, ripgrep"
USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
"""
)

DOCKERFILE = f"""\
# forgehand sandbox image, online recipe: needs to pull debian:bookworm-slim.
# Identical to sandbox/image.py:DOCKERFILE (a unit test checks). Build with `forgehand sandbox build`,
# or by hand: docker build -t forgehand-sandbox:{IMAGE_VERSION} deploy/sandbox
FROM {PULL_BASE}
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \\
      {" ".join(PACKAGES)}
{_COMMON}"""

OFFLINE_DOCKERFILE = f"""\
# forgehand sandbox image, offline recipe, second step: user and labels on top of the imported
# debootstrap root (see build-offline.sh). Identical to sandbox/image.py:OFFLINE_DOCKERFILE.
ARG BASE={BASE_IMAGE}
FROM ${{BASE}}
{_COMMON}"""


def cache_dir() -> Path:
    """Where debootstrap keeps downloaded .deb files, so a forced rebuild downloads nothing."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgehand" / "debootstrap"


def image_is_current(client: docker.DockerClient, tag: str) -> str | None:
    """The id of `tag` if it exists and carries the current recipe version label."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    if labels.get(VERSION_LABEL) != IMAGE_VERSION:
        return None
    return str(image.id)


def _try_pull(client: docker.DockerClient, reporter: Reporter) -> bool:
    reporter.stage("pull", PULL_BASE)
    try:
        client.images.pull(PULL_BASE)
    except docker.errors.APIError as exc:
        reason = str(exc.explanation or exc).splitlines()[0][:100]
        reporter.stage("pull", f"failed ({reason}); using the offline recipe")
        return False
    return True


def _debootstrap(root: Path, reporter: Reporter) -> None:
    if shutil.which("debootstrap") is None:
        raise ImageBuildFailed("debootstrap is not installed", hint="apt-get install debootstrap")
    if os.geteuid() != 0:
        raise ImageBuildFailed("debootstrap needs root", hint="run the build as root, or use the Dockerfile")
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    argv = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        f"--cache-dir={cache}",
        "bookworm",
        str(root),
        DEBIAN_MIRROR,
    ]
    reporter.stage("debootstrap", f"bookworm from {DEBIAN_MIRROR}")
    tail: list[str] = []
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-19:], line.rstrip()]
            reporter.detail(line)
        code = proc.wait()
    if code != 0:
        raise ImageBuildFailed("debootstrap failed:\n" + "\n".join(tail))


def _import_root(client: docker.DockerClient, root: Path, workdir: Path, reporter: Reporter) -> None:
    reporter.stage("pack", "root filesystem")
    tarball = workdir / "rootfs.tar"
    # Device nodes and the apt caches stay out; Docker provides /dev, /proc and /sys at run time.
    argv = [
        "tar",
        "--numeric-owner",
        "-C",
        str(root),
        "--exclude=./dev/*",
        "--exclude=./proc/*",
        "--exclude=./sys/*",
        "--exclude=./var/cache/apt/archives/*.deb",
        "--exclude=./var/lib/apt/lists/*",
        "-cf",
        str(tarball),
        ".",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ImageBuildFailed(f"tar failed: {done.stderr.strip()}")
    repository, _, tag = BASE_IMAGE.rpartition(":")
    reporter.stage("import", BASE_IMAGE)
    try:
        client.api.import_image_from_file(str(tarball), repository=repository, tag=tag, changes=['CMD ["/bin/bash"]'])
    except docker.errors.APIError as exc:
        raise ImageBuildFailed(f"docker import failed: {exc}") from exc


def _build_offline_base(client: docker.DockerClient, reporter: Reporter) -> None:
    with tempfile.TemporaryDirectory(prefix="forgehand-rootfs-", dir="/var/tmp") as tmp:
        workdir = Path(tmp)
        root = workdir / "root"
        _debootstrap(root, reporter)
        _import_root(client, root, workdir, reporter)


def build_image(
    tag: str = DEFAULT_IMAGE,
    *,
    force: bool = False,
    recipe: Recipe = "auto",
    base_url: str | None = None,
    console: Console | None = None,
    timeout: int = 1800,
) -> BuildResult:
    """Build the sandbox image as `tag` (blocking; call it off the event loop).

    recipe "auto" tries to pull debian:bookworm-slim and falls back to the offline recipe
    (debootstrap + docker import) when the pull fails. Nothing is built when an image with the current
    version label already carries `tag`, unless `force`.
    """
    started = time.monotonic()
    client = connect(base_url, timeout)
    reporter = Reporter(console)
    try:
        existing = image_is_current(client, tag)
        if existing and not force:
            if console is not None:
                console.print(f"[green]{tag}[/green] is up to date (version {IMAGE_VERSION}); use --force to rebuild")
            return BuildResult(
                tag=tag, image_id=existing, recipe="cached", built=False, seconds=time.monotonic() - started
            )
        with reporter.running():
            use_dockerfile = recipe == "dockerfile" or (recipe == "auto" and _try_pull(client, reporter))
            if recipe == "dockerfile" and not use_dockerfile:
                raise ImageBuildFailed(f"cannot pull {PULL_BASE}")
            if not use_dockerfile:
                _ensure_offline_base(client, reporter, force=force)
            image_id = _build_recipe(client, reporter, tag, use_dockerfile=use_dockerfile, force=force)
        if existing and existing != image_id:
            # The forced rebuild left the previous image untagged: drop it unless a container uses it.
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(existing)
        return BuildResult(
            tag=tag,
            image_id=image_id,
            recipe="dockerfile" if use_dockerfile else "offline",
            built=True,
            seconds=time.monotonic() - started,
        )
    finally:
        client.close()


def _ensure_offline_base(client: docker.DockerClient, reporter: Reporter, *, force: bool) -> None:
    """The debootstrap base the offline recipe builds on: made when missing or forced, else reused."""
    if force or not _has_image(client, BASE_IMAGE):
        _build_offline_base(client, reporter)
    else:
        reporter.stage("base", f"{BASE_IMAGE} (cached)")


def _build_recipe(
    client: docker.DockerClient, reporter: Reporter, tag: str, *, use_dockerfile: bool, force: bool
) -> str:
    """Build `tag` from the online Dockerfile or on the offline base; returns the image id."""
    labels = {
        VERSION_LABEL: IMAGE_VERSION,
        RECIPE_LABEL: "dockerfile" if use_dockerfile else "offline",
    }
    buildargs = {"FORGEHAND_SANDBOX_VERSION": IMAGE_VERSION}
    if not use_dockerfile:
        buildargs["BASE"] = BASE_IMAGE
    reporter.stage("build", tag)
    return stream_build(
        client,
        reporter,
        fileobj=io.BytesIO((DOCKERFILE if use_dockerfile else OFFLINE_DOCKERFILE).encode()),
        tag=tag,
        buildargs=buildargs,
        labels=labels,
        pull=False,
        nocache=force,
        network_mode="none" if not use_dockerfile else None,
    )


def _has_image(client: docker.DockerClient, ref: str) -> bool:
    try:
        client.images.get(ref)
    except docker.errors.ImageNotFound:
        return False
    return True
