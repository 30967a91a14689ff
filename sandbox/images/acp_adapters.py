"""The ACP adapters of the agents image, and node to run them (the adapters are JavaScript).

Installed on the host at build time like the CLIs (agents_image.py): node from npm's `node-linux-<arch>`
(its `bin/node`, copied to /usr/local/bin/node), each adapter with `npm install --ignore-scripts
--omit=optional` from a generated package.json whose `overrides` pin the adapter's own
dependencies that matter (the Claude agent SDK, @openai/codex) to the versions the image records
in its labels, into `~/.cache/forgehand/agents/acp-<name>-<version>-<digest>/` (reused when
present), and copied into the image under `/opt/forgehand/acp/<name>/`.

Optional dependencies are left out on purpose: they are the adapters' own copies of the agent
binaries (the Claude agent SDK's `claude` 2.1.318, 337 MB; @openai/codex's binary, 400 MB).
The adapters drive the image's pinned binaries instead (`CLAUDE_CODE_EXECUTABLE=/usr/local/bin/claude`,
`CODEX_PATH=/usr/local/bin/codex`, tasks/core/agent_registry.py), so the managed settings and hooks
of /etc/claude-code (and /etc/codex) apply to what they run."""

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import msgspec

from sandbox.errors import ImageBuildFailed

from .building import Reporter

NPM_TIMEOUT_SECONDS = 600
ACP_DIR = "/opt/forgehand/acp"
NODE_LABEL = "org.forgehand.runtime.node"


class NodePin(msgspec.Struct, frozen=True, kw_only=True):
    version: str
    npm: str = "node-linux-{arch}"  # ships bin/node, no install script


class AdapterPin(msgspec.Struct, frozen=True, kw_only=True):
    npm: str
    version: str
    # Exact versions of the adapter's dependencies (npm `overrides`), recorded in the image labels.
    overrides: dict[str, str] = msgspec.field(default_factory=dict)

    @property
    def digest(self) -> str:
        text = json.dumps([self.npm, self.version, self.overrides], sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:8]


NODE_PIN = NodePin(version="24.22.3")

ACP_ADAPTER_PINS: dict[str, AdapterPin] = {
    "claude-agent-acp": AdapterPin(
        npm="@agentclientprotocol/claude-agent-acp",
        version="0.101.0",
        overrides={
            "@anthropic-ai/claude-agent-sdk": "0.3.318",
            "@agentclientprotocol/sdk": "2.4.0",
            "@anthropic-ai/sdk": "1.15.0",
            "@modelcontextprotocol/sdk": "1.32.2",
        },
    ),
    "codex-acp": AdapterPin(
        npm="@agentclientprotocol/codex-acp",
        version="2.6.0",
        overrides={"@openai/codex": "0.171.0", "@agentclientprotocol/sdk": "2.4.0"},
    ),
}


def run_npm(argv: list[str], cwd: Path, what: str) -> None:
    try:
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=NPM_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired as exc:
        raise ImageBuildFailed(f"npm install {what} took over {NPM_TIMEOUT_SECONDS}s") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
        hint = "check that the npm registry is reachable (npm config get registry)"
        raise ImageBuildFailed(f"npm install {what} failed:\n{tail}", hint=hint)


def _npm() -> str:
    npm = shutil.which("npm")
    if npm is None:
        raise ImageBuildFailed("npm is needed to install node and the ACP adapters", hint="install Node.js and npm")
    return npm


def _npm_unless_cached(cached: bool, reporter: Reporter | None, label: str, spec: str) -> str | None:
    """None when the cache has it (reported as cached), else the npm to install `spec` with."""
    if cached:
        if reporter:
            reporter.stage("agent", f"{label} (cached)")
        return None
    npm = _npm()
    if reporter:
        reporter.stage("npm", spec)
    return npm


def _version_of(root: Path, package: str) -> str | None:
    try:
        manifest = json.loads((root / "node_modules" / package / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = manifest.get("version")
    return version if isinstance(version, str) else None


def _staged(cache: Path, final: Path, install: Callable[[Path], None]) -> Path:
    """Install into a staging directory next to `final`, renamed when complete (a cut install is
    never reused)."""
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache))
    try:
        install(staging)
        shutil.rmtree(final, ignore_errors=True)
        staging.rename(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final


def install_node(cache: Path, arch: str, pin: NodePin = NODE_PIN, reporter: Reporter | None = None) -> Path:
    """node's binary from the cache, installing `node-linux-<arch>` with npm first when missing."""
    package = pin.npm.format(arch=arch)
    final = cache / f"node-{pin.version}-{arch}"
    binary = final / "node_modules" / package / "bin" / "node"
    npm = _npm_unless_cached(binary.is_file() and os.access(binary, os.X_OK), reporter, f"node {pin.version}",
                             f"{package}@{pin.version}")  # fmt: skip
    if npm is None:
        return binary

    def install(into: Path) -> None:
        argv = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save", f"{package}@{pin.version}"]
        run_npm(argv, into, f"{package}@{pin.version}")
        if _version_of(into, package) != pin.version:
            raise ImageBuildFailed(f"npm installed {package}@{_version_of(into, package)}, not {pin.version}")

    _staged(cache, final, install)
    if not binary.is_file():
        raise ImageBuildFailed(f"{package}@{pin.version} has no bin/node")
    return binary


def install_adapter(cache: Path, name: str, pin: AdapterPin, reporter: Reporter | None = None) -> Path:
    """The adapter's install directory (its node_modules) from the cache, installed when missing."""
    final = cache / f"acp-{name}-{pin.version}-{pin.digest}"
    cached = _version_of(final, pin.npm) == pin.version and (final / ".complete").is_file()
    npm = _npm_unless_cached(cached, reporter, f"{name} {pin.version}", f"{pin.npm}@{pin.version}")
    if npm is None:
        return final

    def install(into: Path) -> None:
        manifest = {
            "name": f"forgehand-acp-{name}",
            "private": True,
            "dependencies": {pin.npm: pin.version},
            "overrides": pin.overrides,
        }
        (into / "package.json").write_text(json.dumps(manifest, indent=2) + "\n")
        argv = [npm, "install", "--no-audit", "--no-fund", "--ignore-scripts", "--omit=optional"]
        run_npm(argv, into, f"{pin.npm}@{pin.version}")
        for package, version in {pin.npm: pin.version, **pin.overrides}.items():
            found = _version_of(into, package)
            if found is not None and found != version:
                raise ImageBuildFailed(f"npm installed {package}@{found}, not the pinned {version}")
        if _version_of(into, pin.npm) != pin.version:
            raise ImageBuildFailed(f"npm did not install {pin.npm}@{pin.version}")
        (into / ".complete").write_text("ok\n")

    return _staged(cache, final, install)


def adapter_labels(pins: dict[str, AdapterPin] | None = None, node: NodePin = NODE_PIN) -> dict[str, str]:
    """node's version and each adapter's pinned dependencies (the adapters' own versions are agent
    labels, agents_image.py)."""
    pins = ACP_ADAPTER_PINS if pins is None else pins
    labels = {NODE_LABEL: node.version} if pins else {}
    for name, pin in pins.items():
        deps = ",".join(f"{k}@{v}" for k, v in sorted(pin.overrides.items()))
        labels[f"org.forgehand.acp.{name}.dependencies"] = deps
    return labels
