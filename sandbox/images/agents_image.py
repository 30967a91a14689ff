"""The agents image: the sandbox image plus the agent CLIs at pinned versions, the managed settings,
the hook bridge and the relay (agent_files.py).

`build_agents_image` is what `forgehand sandbox build --agents` and the test session call. The CLIs
are installed on the host at build time, `npm install --ignore-scripts` into a cache directory
(`~/.cache/forgehand/agents/<name>-<version>`, reused when present), and only their native binaries
are copied into the build context; the image is built FROM the plain sandbox image (built first if
missing) with network none. Nothing is fetched when a task runs. The image carries labels naming
its recipe version, a digest of its recipe texts and each agent's version
(`org.forgehand.agent.<name>`); an image whose labels match the current recipe and pins is left
alone unless forced, and a changed pin or script rebuilds it.
"""

import contextlib
import hashlib
import io
import json
import os
import platform
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import docker
import docker.errors
import msgspec
from rich.console import Console

from sandbox.errors import AgentMissing, ImageBuildFailed
from sandbox.protocols import EngineCalls
from sandbox.relays import RELAY_SCRIPT

from .acp_adapters import (
    ACP_ADAPTER_PINS,
    ACP_DIR,
    NODE_PIN,
    AdapterPin,
    adapter_labels,
    install_adapter,
    install_node,
    run_npm,
)
from .agent_files import (
    CODEX_REQUIREMENTS,
    CODEX_REQUIREMENTS_PATH,
    HOOK_PATH,
    HOOK_SCRIPT,
    MANAGED_SETTINGS,
    MANAGED_SETTINGS_PATH,
    RELAY_PATH,
)
from .building import BuildResult, Reporter, connect, stream_build
from .names import AGENTS_IMAGE_REPOSITORY as AGENTS_IMAGE_REPOSITORY
from .names import AGENTS_IMAGE_VERSION as AGENTS_IMAGE_VERSION
from .names import DEFAULT_AGENTS_IMAGE as DEFAULT_AGENTS_IMAGE
from .sandbox_image import DEFAULT_IMAGE, IMAGE_VERSION, VERSION_LABEL, build_image

# AGENTS_IMAGE_VERSION (names.py): bump it when the recipe below or a file in agent_files.py changes.
AGENTS_VERSION_LABEL = "org.forgehand.agents.version"
RECIPE_DIGEST_LABEL = "org.forgehand.agents.recipe"
AGENT_LABEL_PREFIX = "org.forgehand.agent."


class AgentPin(msgspec.Struct, frozen=True, kw_only=True):
    npm: str  # the npm package
    version: str
    # The native binary inside node_modules, `{arch}` being npm's cpu name (x64, arm64) and
    # `{machine}` the kernel's (x86_64, aarch64).
    binary: str
    command: str  # its name in the image, under /usr/local/bin


AGENT_PINS: dict[str, AgentPin] = {
    "claude-code": AgentPin(
        npm="@anthropic-ai/claude-code",
        version="2.1.332",
        binary="@anthropic-ai/claude-code-linux-{arch}/claude",
        command="claude",
    ),
    # The platform binary comes as an npm alias (`@openai/codex-linux-x64` is
    # `npm:@openai/codex@0.171.0-linux-x64`), a static musl build; its bundled rg and helpers are
    # not needed by `codex exec`.
    "codex": AgentPin(
        npm="@openai/codex",
        version="0.171.0",
        binary="@openai/codex-linux-{arch}/vendor/{machine}-unknown-linux-musl/bin/codex",
        command="codex",
    ),
}

_NPM_ARCH = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}
_MACHINE = {"x64": "x86_64", "arm64": "aarch64"}

AGENTS_DOCKERFILE = f"""\
# forgehand agents image: the sandbox image plus the agent CLIs, managed settings and the hook
# bridge. Identical to sandbox/agents.py:AGENTS_DOCKERFILE (a unit test checks). Build it with
# `forgehand sandbox build --agents`, which puts the CLI binaries (from a host-side npm install)
# next to this file; the build itself needs no network.
ARG BASE={DEFAULT_IMAGE}
FROM ${{BASE}}
# COPY makes them root's and keeps the context's modes (0755, settings 0644); no RUN touches them
# afterwards, which would store the binaries a second time in another layer.
COPY bin/ /usr/local/bin/
# node (bin/node above) and the ACP adapters, each with its node_modules (sandbox/acp_adapters.py).
COPY acp/ {ACP_DIR}/
COPY managed-settings.json {MANAGED_SETTINGS_PATH}
COPY requirements.toml {CODEX_REQUIREMENTS_PATH}
ARG FORGEHAND_AGENTS_VERSION={AGENTS_IMAGE_VERSION}
LABEL {AGENTS_VERSION_LABEL}=$FORGEHAND_AGENTS_VERSION \\
      org.opencontainers.image.title="forgehand sandbox with agents"
USER 1000:1000
WORKDIR /workspace
CMD ["sleep", "infinity"]
"""


# What the image is made of besides the binaries: a change to any of these texts rebuilds the image
# even if nobody bumped AGENTS_IMAGE_VERSION.
RECIPE_DIGEST = hashlib.sha256(
    "\0".join((AGENTS_DOCKERFILE, MANAGED_SETTINGS, CODEX_REQUIREMENTS, HOOK_SCRIPT, RELAY_SCRIPT)).encode()
).hexdigest()[:16]


def agent_labels(
    pins: dict[str, AgentPin] | None = None, adapters: dict[str, AdapterPin] | None = None
) -> dict[str, str]:
    """The labels an up-to-date agents image carries: each CLI's and each ACP adapter's version
    (`org.forgehand.agent.<name>`), node's, and the adapters' pinned dependencies."""
    pins = AGENT_PINS if pins is None else pins
    adapters = ACP_ADAPTER_PINS if adapters is None else adapters
    labels = {AGENTS_VERSION_LABEL: AGENTS_IMAGE_VERSION, RECIPE_DIGEST_LABEL: RECIPE_DIGEST}
    labels.update({AGENT_LABEL_PREFIX + name: pin.version for name, pin in pins.items()})
    labels.update({AGENT_LABEL_PREFIX + name: pin.version for name, pin in adapters.items()})
    labels.update(adapter_labels(adapters))
    return labels


def agents_from_labels(labels: dict[str, str]) -> dict[str, str]:
    return {k[len(AGENT_LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(AGENT_LABEL_PREFIX)}


def agents_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "forgehand" / "agents"


def npm_arch(machine: str | None = None) -> str:
    machine = (machine or platform.machine()).lower()
    if machine not in _NPM_ARCH:
        raise ImageBuildFailed(f"no agent binaries for this machine ({machine})", hint="build on x86_64 or aarch64")
    return _NPM_ARCH[machine]


def _binary_path(root: Path, pin: AgentPin, arch: str) -> Path:
    return root / "node_modules" / pin.binary.format(arch=arch, machine=_MACHINE.get(arch, arch))


def install_agent(name: str, pin: AgentPin, *, arch: str | None = None, reporter: Reporter | None = None) -> Path:
    """The agent's native binary from the cache, installing it with npm first when missing."""
    arch = arch or npm_arch()
    final = agents_cache_dir() / f"{name}-{pin.version}"
    binary = _binary_path(final, pin, arch)
    if binary.is_file() and os.access(binary, os.X_OK):
        if reporter:
            reporter.stage("agent", f"{name} {pin.version} (cached)")
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise ImageBuildFailed(
            f"npm is needed to install {pin.npm}@{pin.version}", hint="install Node.js and npm on the build host"
        )
    if reporter:
        reporter.stage("npm", f"{pin.npm}@{pin.version}")
    final.parent.mkdir(parents=True, exist_ok=True)
    # Installed next to the final place and renamed when complete: a cut install is never reused.
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        _npm_install(npm, pin, staging)
        staged = _binary_path(staging, pin, arch)
        installed = _installed_version(staging, pin)
        if installed != pin.version:
            raise ImageBuildFailed(f"npm installed {pin.npm}@{installed or '?'}, not the pinned {pin.version}")
        if not staged.is_file():
            raise ImageBuildFailed(
                f"npm installed {pin.npm}@{installed} without {staged.relative_to(staging / 'node_modules')}",
                hint="the package may not ship a binary for this machine",
            )
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return binary


def _npm_install(npm: str, pin: AgentPin, into: Path) -> None:
    argv = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save", f"{pin.npm}@{pin.version}"]
    run_npm(argv, into, f"{pin.npm}@{pin.version}")


def _installed_version(root: Path, pin: AgentPin) -> str | None:
    try:
        manifest = json.loads((root / "node_modules" / pin.npm / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = manifest.get("version")
    return version if isinstance(version, str) else None


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
    return info


def _context(
    binaries: dict[str, Path],
    pins: dict[str, AgentPin],
    node: Path | None = None,
    adapters: dict[str, Path] | None = None,
) -> io.BufferedRandom:
    """The build context as a tar file on disk (the binaries are hundreds of MB each)."""
    context = tempfile.TemporaryFile(dir="/var/tmp")  # noqa: SIM115 (handed to the build, closed after)

    def add(name: str, data: bytes, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = len(data), mode
        tar.addfile(info, io.BytesIO(data))

    with tarfile.open(fileobj=context, mode="w") as tar:
        add("Dockerfile", AGENTS_DOCKERFILE.encode(), 0o644)
        add("managed-settings.json", MANAGED_SETTINGS.encode(), 0o644)
        add("requirements.toml", CODEX_REQUIREMENTS.encode(), 0o644)
        add("bin/" + Path(HOOK_PATH).name, HOOK_SCRIPT.encode(), 0o755)
        add("bin/" + Path(RELAY_PATH).name, RELAY_SCRIPT.encode(), 0o755)
        add("acp/README", b"forgehand: the ACP adapters, one directory each (sandbox/acp_adapters.py)\n", 0o644)
        if node is not None:
            tar.add(str(node), arcname="bin/node", filter=_root_owned)
        for name, root in (adapters or {}).items():
            tar.add(str(root / "node_modules"), arcname=f"acp/{name}/node_modules", filter=_root_owned)
            tar.add(str(root / "package.json"), arcname=f"acp/{name}/package.json", filter=_root_owned)
        for name, path in binaries.items():
            info = tar.gettarinfo(str(path), arcname="bin/" + pins[name].command)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755
            with path.open("rb") as fh:
                tar.addfile(info, fh)
    context.seek(0)
    return context


def agents_image_is_current(
    client: docker.DockerClient, tag: str, pins: dict[str, AgentPin], adapters: dict[str, AdapterPin] | None = None
) -> str | None:
    """The id of `tag` if its labels name the current recipe, base version and pins."""
    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    adapters = ACP_ADAPTER_PINS if adapters is None else adapters
    want = {**agent_labels(pins, adapters), VERSION_LABEL: IMAGE_VERSION}
    if any(labels.get(k) != v for k, v in want.items()):
        return None
    versions = {name: pin.version for name, pin in pins.items()}
    versions.update({name: pin.version for name, pin in adapters.items()})
    if agents_from_labels(labels) != versions:
        return None  # an agent dropped from the pins
    return str(image.id)


def build_agents_image(
    tag: str = DEFAULT_AGENTS_IMAGE,
    *,
    base: str = DEFAULT_IMAGE,
    force: bool = False,
    pins: dict[str, AgentPin] | None = None,
    adapters: dict[str, AdapterPin] | None = None,
    base_url: str | None = None,
    console: Console | None = None,
    timeout: int = 1800,
) -> BuildResult:
    """Build the agents image as `tag` (blocking; call it off the event loop)."""
    started = time.monotonic()
    pins = AGENT_PINS if pins is None else pins
    adapters = ACP_ADAPTER_PINS if adapters is None else adapters
    client = connect(base_url, timeout)
    reporter = Reporter(console)
    try:
        existing = agents_image_is_current(client, tag, pins, adapters)
        if existing and not force:
            if console is not None:
                console.print(f"[green]{tag}[/green] is up to date ({_describe(pins)}); use --force to rebuild")
            return BuildResult(
                tag=tag, image_id=existing, recipe="cached", built=False, seconds=time.monotonic() - started
            )
        # The plain image first (cached when current); its own reporter prints its stages.
        build_image(base, base_url=base_url, console=console, timeout=timeout)
        with reporter.running():
            arch = npm_arch()
            binaries = {name: install_agent(name, pin, arch=arch, reporter=reporter) for name, pin in pins.items()}
            cache = agents_cache_dir()
            node = install_node(cache, arch, NODE_PIN, reporter) if adapters else None
            installed = {name: install_adapter(cache, name, pin, reporter) for name, pin in adapters.items()}
            reporter.stage("build", f"{tag} ({_describe(pins)})")
            with _context(binaries, pins, node, installed) as context:
                image_id = stream_build(
                    client,
                    reporter,
                    fileobj=context,
                    custom_context=True,
                    tag=tag,
                    buildargs={"BASE": base, "FORGEHAND_AGENTS_VERSION": AGENTS_IMAGE_VERSION},
                    labels=agent_labels(pins, adapters),
                    pull=False,
                    nocache=force,
                    network_mode="none",
                )
        if existing and existing != image_id:
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(existing)
        return BuildResult(tag=tag, image_id=image_id, recipe="agents", built=True, seconds=time.monotonic() - started)
    finally:
        client.close()


def _describe(pins: dict[str, AgentPin]) -> str:
    return ", ".join(f"{name} {pin.version}" for name, pin in pins.items()) or "no agents"


async def installed_agents(engine: EngineCalls, image: str = DEFAULT_AGENTS_IMAGE) -> dict[str, str]:
    """The agents in `image` and their versions (from its labels); empty when the image is missing."""

    def labels(c: docker.DockerClient) -> dict[str, str]:
        try:
            found = c.images.get(image)
        except docker.errors.ImageNotFound:
            return {}
        return dict((found.attrs.get("Config") or {}).get("Labels") or {})

    return agents_from_labels(await engine.call(labels))


async def require_agent(engine: EngineCalls, name: str, image: str = DEFAULT_AGENTS_IMAGE) -> str:
    """The version of agent `name` in `image`; AgentMissing (before any container starts) if absent."""
    agents = await installed_agents(engine, image)
    if name not in agents:
        what = f"the image {image} has no {name}" if agents else f"the agents image {image} is missing"
        raise AgentMissing(f"{what} (installed: {', '.join(sorted(agents)) or 'none'})")
    return agents[name]
