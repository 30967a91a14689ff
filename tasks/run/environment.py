"""A run's environment (docs/environments.md), a step of provisioning: the repository's declared
environment (`.forgehand/environment.yml` or a devcontainer.json subset, read from the head of the
repository's DEFAULT branch, never from the task's branch or base), built once into an image and
reused by every task until its cache key changes.

The key (`sandbox.environment.spec.cache_key`) covers the base image's id, the setup, its
environment, its egress rules and secret names, the content of the declared cache files at the
base commit and forgehand's version; the image's tag adds the instance and the repository, so an
image built with one repository's secrets never serves another. A build runs the setup in a
hardened container (sandbox/environment/build.py) with the setup-only secrets as read-only files
and the setup-only egress rules through a proxy of its own; the agent's sandbox then starts from
the committed image with the run's own egress rules only. Builds of one key in this process wait
for each other (`EnvironmentBuilds`): two tasks on a cold cache build once.
"""

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
import msgspec
import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from egress import SOCKET_NAME as EGRESS_SOCKET
from egress import AllowedHosts, RuleError, RuleSet
from forge.core.settings import Settings
from forge.core.version import VERSION
from forge.db.engine import Database
from forge.repos.repo_secrets import RepoSecrets, secret_box
from sandbox import DEFAULT_AGENTS_IMAGE, EGRESS_PROXY_PORT, MiB, Relay, prepare_workspace, remove_workspace
from sandbox.environment.build import MAX_CHANGED_PATHS, BuildResult, SetupChannel, build_environment
from sandbox.environment.declaration import parse_environment
from sandbox.environment.images import prune_images
from sandbox.environment.spec import ENVIRONMENT_FILES, ENVIRONMENT_YML, MAX_INPUT_BYTES, EnvironmentSpec, cache_key
from sandbox.errors import EnvironmentRefused
from sandbox.images.agents_image import AGENT_LABEL_PREFIX
from tasks.core.egress_config import EgressPlan
from tasks.core.environment_images import operator_images
from tasks.core.redaction import Redactor
from tasks.core.states import FailureReason
from tasks.run import gitops, warm
from tasks.run.egress import Notify, open_run_egress, proxy_env
from tasks.run.env import RunEnv
from tasks.run.outside import ProvisionFailed

log = structlog.get_logger("forgehand.environments")

IMAGE_REPOSITORY = "forgehand-env"
LABEL_REPO = "forgehand.env.repo"
LABEL_KEY = "forgehand.env.key"
LABEL_KIND = "forgehand.image"
IN_SETTINGS = "the repository's settings"
OVERRIDE_ONLY = "no declaration"
LOG_IN_TRANSCRIPT = 32 * 1024  # the setup's log kept in the `environment` event (head and tail)

System = Callable[..., Awaitable[None]]
Secrets = Callable[[tuple[str, ...]], Awaitable[dict[str, str]]]


@dataclass(frozen=True)
class Declared:
    spec: EnvironmentSpec
    base_image: str
    tag: str
    key: str


@dataclass
class EnvironmentStep:
    """The environment of one run (what provisioning hands it)."""

    env: RunEnv
    repo_key: tuple[str, str]
    repo_uuid: str
    default_branch: str
    run_uuid: str
    generation: int  # the repository's environment generation (a forced rebuild counts it up)
    in_settings: str | None  # an environment declared in the repository's settings (it wins over a file)
    override: dict[str, Any] | None  # a repository admin's change for this task: {"image", "extra_setup"}
    registered_images: tuple[str, ...]  # the images an instance admin registered
    system: System  # (phase, text, t0, **detail): a `system` transcript event
    secrets: Secrets  # the repository's setup secrets by name (the missing ones left out)
    notify_blocked: Notify
    emit: Any  # the run's transcript emit (egress refusals of the setup land there)
    source_sha: str | None = None  # the default branch's head the declaration was read from

    async def image(self, runtime_image: str) -> str:
        """The image the run's sandbox starts from: `runtime_image`, or its environment's (whose
        warm sandboxes the worker then keeps, when it keeps any: warm.pool_environment)."""
        declared = await self._declared(runtime_image)
        if declared is None:
            return runtime_image
        t0 = time.monotonic()
        # Builds of one image wait for each other: two tasks on a cold cache build once.
        async with build_turn(self.env.db, self.env.environment_builds, declared.tag, await self._engine_id()):
            if await self._exists(declared.tag):
                await self.system(
                    "environment", f"environment from the cache ({declared.spec.source})", t0,
                    image=declared.tag, base=declared.base_image, cached=True, source=declared.spec.source,
                )  # fmt: skip
            else:
                await self._report(declared, await self._build(declared), t0)
        await warm.pool_environment(self.env, declared.tag, prefix=f"{IMAGE_REPOSITORY}:")
        return declared.tag

    # --- what the repository declares ---------------------------------------------------------

    async def _declared(self, runtime_image: str) -> Declared | None:
        store = self.env.store
        # The default branch's head, whatever the task's base: a task may start from any branch
        # (its own, a pull request's head, a parent task's work for a subtask), and whoever can
        # push there must not choose the setup that gets the repository's secrets, nor build the
        # image every task of the default branch then starts from.
        self.source_sha = await store.read(self.repo_key, gitops.branch_sha, self.default_branch)
        if self.source_sha is None:
            return None
        if self.in_settings is not None:  # a repository admin's declaration takes the file's place
            path, data = IN_SETTINGS, self.in_settings.encode()
        else:
            found = await store.read(
                self.repo_key, gitops.first_file_at, self.source_sha, ENVIRONMENT_FILES, MAX_INPUT_BYTES
            )
            if found is None and not self.override:
                return None
            # Nothing declared, but the task's override names an image or a step: that alone.
            path, data = found or (OVERRIDE_ONLY, b"image: sandbox\n")
        try:
            # In a thread: a declaration is up to 64 KiB of someone's text, parsed fully.
            spec = await asyncio.to_thread(
                parse_environment, ENVIRONMENT_YML if path in (IN_SETTINGS, OVERRIDE_ONLY) else path, data,
                allowed_images=self._allowed_images(),
            )  # fmt: skip
        except EnvironmentRefused as exc:
            raise ProvisionFailed(
                FailureReason.ENVIRONMENT_SETUP, f"the environment in {path} is refused: {'; '.join(exc.problems)}"
            ) from exc
        spec = self._overridden(msgspec.structs.replace(spec, source=path))
        base = await self._base_image(spec, runtime_image)
        hashes = await store.read(self.repo_key, gitops.blob_ids_at, self.source_sha, spec.cache_files)
        base_id = await self._image_id(base)
        key = cache_key(spec, base_id, hashes, f"{VERSION}/{self.generation}")
        own = hashlib.sha256(f"{self.env.instance}\0{self.repo_uuid}\0{key}".encode()).hexdigest()
        return Declared(spec=spec, base_image=base, tag=f"{IMAGE_REPOSITORY}:{own[:48]}", key=key)

    def _overridden(self, spec: EnvironmentSpec) -> EnvironmentSpec:
        """The task's override applied (another image, a step after the setup): its own key, its
        own image; the repository's stays as it is."""
        if not self.override:
            return spec
        image = str(self.override.get("image") or "") or spec.image
        extra = str(self.override.get("extra_setup") or "")
        setup = f"{spec.setup}\n{extra}" if spec.setup and extra else spec.setup or extra
        return msgspec.structs.replace(
            spec, image=image, setup=setup, source=f"{spec.source}, with the task's override"
        )

    def _allowed_images(self) -> set[str]:
        """The built-in images, by name ("sandbox", "agents") or by their reference, the operator's
        (FORGEHAND_ENVIRONMENT_EXTRA_IMAGES) and the registered ones."""
        return {"sandbox", "agents", self.env.image, self._agents_image(), *self._extra_images()}

    def _extra_images(self) -> list[str]:
        """The operator's images and those an instance admin registered."""
        return [*operator_images(self.env.settings), *self.registered_images]

    def _agents_image(self) -> str:
        return self.env.agents_image or DEFAULT_AGENTS_IMAGE

    async def _base_image(self, spec: EnvironmentSpec, runtime_image: str) -> str:
        """A CLI agent's run starts from its runtime's image (the agents image, built on the sandbox
        image, or an operator's): its CLI must be there. A registered (or the operator's) image
        serves it only when it carries the same agent CLIs at the same versions (its labels say so:
        an image built FROM the agents image). Otherwise the declaration chooses."""
        if runtime_image != self.env.image:
            if spec.image in self._extra_images() and await self._same_agents(spec.image, runtime_image):
                return spec.image
            return runtime_image
        if spec.image in self._extra_images():
            return spec.image
        return self._agents_image() if spec.image in ("agents", self._agents_image()) else runtime_image

    async def _same_agents(self, image: str, runtime_image: str) -> bool:
        """`image` holds every agent CLI of `runtime_image`, at the same versions (by their labels)."""

        def agents(c: Any, ref: str) -> dict[str, str]:
            labels = (c.api.inspect_image(ref).get("Config") or {}).get("Labels") or {}
            return {k: v for k, v in labels.items() if k.startswith(AGENT_LABEL_PREFIX)}

        try:
            wanted = await self.env.engine.call(lambda c: agents(c, runtime_image))
            found = await self.env.engine.call(lambda c: agents(c, image))
        except docker.errors.DockerException:
            return False
        return bool(wanted) and all(found.get(k) == v for k, v in wanted.items())

    async def _image_id(self, image: str) -> str:
        try:
            found: dict[str, Any] = await self.env.engine.call(lambda c: c.api.inspect_image(image))
        except docker.errors.ImageNotFound as exc:
            raise ProvisionFailed(
                FailureReason.IMAGE_MISSING,
                f"the image {image} is not on this worker's Docker engine: build or load it there "
                "(`forgehand sandbox build` for the built-in ones; nothing is ever pulled)",
            ) from exc
        return str(found["Id"])

    async def _engine_id(self) -> str:
        info: dict[str, Any] = await self.env.engine.call(lambda c: c.info())
        return str(info.get("ID") or info.get("Name") or "")

    async def _exists(self, tag: str) -> bool:
        try:
            await self.env.engine.call(lambda c: c.api.inspect_image(tag))
        except docker.errors.ImageNotFound:
            return False
        return True

    # --- the build ----------------------------------------------------------------------------

    async def _build(self, declared: Declared) -> BuildResult:
        spec = declared.spec
        values = await self.secrets(spec.setup_secrets)
        missing = [name for name in spec.setup_secrets if name not in values]
        if missing:
            raise ProvisionFailed(
                FailureReason.ENVIRONMENT_SETUP,
                f"the environment's setup needs the repository secret(s) {', '.join(missing)}: "
                "add them in the repository's settings (Secrets)",
            )
        t0 = time.monotonic()
        await self.system(
            "environment", f"building the environment ({spec.source})", t0, image=declared.tag, cached=False
        )
        workspace = self.env.settings.data_dir.resolve() / "environments" / uuid.uuid4().hex
        egress = None
        try:
            # Its own filesystem of the run's workspace size, as a run's: a setup that writes into
            # its checkout cannot fill the host's disk (the image's layer has its own watchdog).
            await asyncio.to_thread(prepare_workspace, workspace, limit_bytes=warm.mount_limit(self.env.settings))
            assert self.source_sha is not None
            await self.env.store.read(self.repo_key, gitops.checkout_tree, self.source_sha, workspace)
            channel = None
            if spec.setup_egress:
                egress = await open_run_egress(
                    self._setup_plan(spec), None, self.env.settings.effective_run_channel_dir,
                    f"env-{self.run_uuid}", emit=self.emit, notify=self.notify_blocked, phase="environment",
                )  # fmt: skip
                channel = SetupChannel(
                    directory=egress.host_dir, relays=(Relay(EGRESS_PROXY_PORT, EGRESS_SOCKET),), env=proxy_env()
                )
            result = await self._run_build(declared, workspace, values, channel)
            # The setup's log goes to the transcript, which the task's readers see: a setup that
            # printed a secret (set -x, a verbose installer) does not show it there.
            return msgspec.structs.replace(result, log_tail=Redactor(values.values()).redact(result.log_tail))
        finally:
            if egress is not None:
                await egress.close()
            await asyncio.to_thread(remove_workspace, workspace)

    def _setup_plan(self, spec: EnvironmentSpec) -> EgressPlan:
        try:
            rules = RuleSet.build(list(spec.setup_egress), ())
        except RuleError as exc:
            raise ProvisionFailed(FailureReason.ENVIRONMENT_SETUP, f"a setup_egress rule is refused: {exc}") from exc
        allowed = AllowedHosts.parse(self.env.settings.egress_allowed_hosts)
        return EgressPlan(rules=rules, allowed_hosts=allowed, presets=(), repo_rules=spec.setup_egress)

    async def _run_build(
        self, declared: Declared, workspace: Path, secrets: dict[str, str], channel: SetupChannel | None
    ) -> BuildResult:
        spec = declared.spec
        labels = {
            LABEL_REPO: self.repo_uuid, LABEL_KEY: declared.key, LABEL_KIND: "environment",
            "forgehand.instance": self.env.instance,
        }  # fmt: skip

        def build(client: docker.DockerClient) -> BuildResult:
            return build_environment(
                client, spec, base_image=declared.base_image, tag=declared.tag, workspace=workspace,
                secrets=secrets, labels=labels, instance=self.env.instance, channel=channel,
                disk_bytes=self.env.settings.environment_disk_limit_mb * MiB, run_label=self.run_uuid,
            )  # fmt: skip

        try:
            return await self.env.engine.call(build, timeout=spec.timeout_seconds + 180)
        except TimeoutError as exc:
            raise ProvisionFailed(
                FailureReason.ENVIRONMENT_SETUP, f"the environment's build did not end within {spec.timeout_seconds} s"
            ) from exc

    async def _prune(self, tag: str) -> None:
        await _prune_images(self.env, tag)

    async def _report(self, declared: Declared, result: BuildResult, t0: float) -> None:
        """The build's `environment` event with its log; a failed build fails the run."""
        log_text = _capped(result.log_tail)
        detail = {
            "image": declared.tag, "base": declared.base_image, "cached": False,
            "source": declared.spec.source, "log": log_text,
        }  # fmt: skip
        if result.ok:
            await self.system("environment", f"environment built in {result.seconds:.1f} s", t0, **detail)
            await self._prune(declared.tag)
            return
        if result.reason == "secret_in_environment":
            text = (
                f"the environment's setup left the secret {result.secret} in what would have been the image "
                "(a file, a name or the image's settings): nothing was kept"
            )
            await self.system("environment", text, t0, **detail, reason=result.reason)
            raise ProvisionFailed(FailureReason.SECRET_IN_ENVIRONMENT, text)
        if result.reason == "timed_out":
            text = f"the environment's setup did not end within {declared.spec.timeout_seconds} s and was stopped"
        elif result.reason == "disk_limit":
            limit = self.env.settings.environment_disk_limit_mb
            text = (
                f"the environment's setup wrote more than {limit} MiB (FORGEHAND_ENVIRONMENT_DISK_LIMIT_MB) "
                f"or {MAX_CHANGED_PATHS:,} files and was stopped; nothing was kept"
            )
        else:
            text = f"the environment's setup failed (exit {result.exit_code}): {_tail(result.log_tail)}"
        await self.system("environment", text, t0, **detail, reason=result.reason)
        raise ProvisionFailed(FailureReason.ENVIRONMENT_SETUP, text)


async def _prune_images(env: RunEnv, keep: str) -> None:
    """This instance's environment images within FORGEHAND_ENVIRONMENT_IMAGES_LIMIT_MB, oldest out."""
    limit = env.settings.environment_images_limit_mb * MiB
    labels = {"forgehand.instance": env.instance, LABEL_KIND: "environment"}
    try:
        removed = await env.engine.call(lambda c: prune_images(c, labels, limit, keep), timeout=300)
    except Exception:  # a failed clean-up never fails the run that built its image
        log.warning("old environment images were not removed", exc_info=True)
        return
    if removed:
        log.info("old environment images removed", count=len(removed))


@contextlib.asynccontextmanager
async def build_turn(db: Database, builds: dict[str, asyncio.Lock], tag: str, engine_id: str) -> AsyncIterator[None]:
    """The turn to build `tag`: in this process an asyncio lock; on PostgreSQL also a session
    advisory lock named by the image and the Docker engine, held on a connection of its own for the
    build, so that worker processes sharing an engine build an image once (the others wait, then
    find it). Workers on other engines build their own copy, as they must. SQLite has one process."""
    async with builds.setdefault(tag, asyncio.Lock()):
        if db.engine.dialect.name != "postgresql":
            yield
            return
        digest = hashlib.sha256(f"forgehand-environment\0{engine_id}\0{tag}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        async with db.engine.connect() as conn:
            await conn.execute(sa.text("SELECT pg_advisory_lock(:key)"), {"key": key})
            await conn.commit()
            try:
                yield
            finally:
                await conn.execute(sa.text("SELECT pg_advisory_unlock(:key)"), {"key": key})
                await conn.commit()


def _capped(text: str) -> str:
    if len(text) <= LOG_IN_TRANSCRIPT:
        return text
    half = LOG_IN_TRANSCRIPT // 2
    return f"{text[:half]}\n[... {len(text) - LOG_IN_TRANSCRIPT} characters cut ...]\n{text[-half:]}"


def _tail(text: str, lines: int = 5) -> str:
    kept = [line for line in text.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-600:] or "no output"


async def remove_environment_images(env: RunEnv, repo_uuid: str) -> int:
    """Remove the environment images of one repository on this engine (a forced rebuild)."""

    def remove(client: docker.DockerClient) -> int:
        gone = 0
        for image in client.images.list(filters={"label": f"{LABEL_REPO}={repo_uuid}"}):
            with contextlib.suppress(docker.errors.APIError):
                client.images.remove(image.id, force=True)
                gone += 1
        return gone

    removed: int = await env.engine.call(remove, timeout=120)
    log.info("environment images removed", repo=repo_uuid, count=removed)
    return removed


async def repo_secrets_of(
    session: AsyncSession, settings: Settings, repo_id: int, names: tuple[str, ...]
) -> dict[str, str]:
    """The repository's secrets of those `names` it has (decrypted, for a build only)."""
    return await RepoSecrets(session=session, box=secret_box(settings)).values(repo_id, names)
