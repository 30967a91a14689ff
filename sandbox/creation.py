"""Creating a container so that a caller who gives up half-way never leaves one behind.

The Docker SDK blocks, so a creation runs in a pool thread, and cancelling the awaiting coroutine
does not stop the thread's `create` or `start`. A `Creation` is what both sides share: whichever
comes second sees what the other did. The thread, seeing the caller gone, removes the container it
made; the caller, seeing a container already handed over, has it removed (`SandboxEngine.remove_later`).
"""

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from concurrent.futures import wait as futures_wait
from typing import Any

import docker
import docker.errors

from .errors import AgentMissing, EngineUnavailable, ImageMissing, SpecRefused
from .images.names import AGENTS_IMAGE_REPOSITORY

Invoke = Callable[[Callable[[docker.DockerClient], Any]], Any]

# The keywords of `spec.container_create_kwargs` that are the container's own (parameters of the
# low-level `APIClient.create_container`); every other one is a parameter of its host config.
CONTAINER_KEYS = frozenset(
    {
        "image",
        "command",
        "entrypoint",
        "detach",
        "user",
        "working_dir",
        "hostname",
        "environment",
        "labels",
        "name",
        "stdin_open",
        "tty",
        "network_disabled",
    }
)


class Abandoned(Exception):
    """The caller gave up (cancelled, timed out, the engine closed) before the container was handed over."""


class Creation:
    """One creation in flight (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.abandoned = False
        self._container_id: str | None = None
        self._handed_over = False

    def created(self, container_id: str) -> bool:
        """The thread made `container_id`; False when the caller has given up."""
        with self._lock:
            self._container_id = container_id
            return not self.abandoned

    def hand_over(self) -> bool:
        """The container runs; True when the caller still wants it (it owns it from then on)."""
        with self._lock:
            self._handed_over = not self.abandoned
            return self._handed_over

    def abandon(self) -> str | None:
        """The caller gives up; returns the id of a container already handed over (now nobody's)."""
        with self._lock:
            self.abandoned = True
            return self._container_id if self._handed_over else None


def remove_container(c: docker.DockerClient, container_id: str) -> None:
    """Kill and delete; a container already gone, or being removed elsewhere (409), is fine."""
    try:
        c.api.remove_container(container_id, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:
            raise


def low_level_create_args(api: docker.APIClient, kwargs: dict[str, Any]) -> dict[str, Any]:
    """`containers.create` keywords as the low-level `create_container` takes them, the way docker-py
    turns one into the other: the container's own keywords, and the rest as a host config built by
    `APIClient.create_host_config` for the engine's API version. The low-level create returns the id
    before any further call (`containers.create` inspects the container next), so a container that
    exists is always known and can be removed."""
    args = {key: value for key, value in kwargs.items() if key in CONTAINER_KEYS}
    args["host_config"] = api.create_host_config(**{k: v for k, v in kwargs.items() if k not in CONTAINER_KEYS})
    return args


def create_and_start(c: docker.DockerClient, kwargs: dict[str, Any], creation: Creation) -> str:
    """In a pool thread: create and start the container, removing it again if abandoned meanwhile."""
    if creation.abandoned:
        raise Abandoned
    args = low_level_create_args(c.api, kwargs)
    try:
        container_id = str(c.api.create_container(**args)["Id"])
    except docker.errors.ImageNotFound as exc:
        missing = AgentMissing if str(kwargs["image"]).startswith(AGENTS_IMAGE_REPOSITORY + ":") else ImageMissing
        raise missing(f"image {kwargs['image']!r} is not on the engine") from exc
    except docker.errors.APIError as exc:
        raise SpecRefused(f"the engine refused the sandbox: {exc.explanation or exc}") from exc
    if not creation.created(container_id):
        remove_container(c, container_id)
        raise Abandoned
    try:
        c.api.start(container_id)
    except BaseException as exc:
        # Whatever went wrong (a refusal, a timeout whose start may still happen), nobody will
        # own this container.
        with contextlib.suppress(Exception):
            remove_container(c, container_id)
        if isinstance(exc, docker.errors.APIError):
            raise SpecRefused(f"the engine could not start the sandbox: {exc.explanation or exc}") from exc
        raise
    if not creation.hand_over():
        remove_container(c, container_id)
        raise Abandoned
    return container_id


class InFlight:
    """The engine's creations in flight and background removals, so that closing can wait for them."""

    def __init__(self, executor: Executor, invoke: Invoke) -> None:
        self._executor = executor
        self._invoke = invoke
        self._creations: dict[Future[str], Creation] = {}
        self._cleanups: set[Future[None]] = set()
        self._lock = threading.Lock()  # done callbacks run in the pool's threads
        self.closed = False

    def _track(self, future: Future[Any], creation: Creation | None = None) -> None:
        def forget(done: Future[Any]) -> None:
            with self._lock:
                self._creations.pop(done, None)
                self._cleanups.discard(done)

        with self._lock:
            if creation is None:
                self._cleanups.add(future)
            else:
                self._creations[future] = creation
        future.add_done_callback(forget)

    def _pending(self, *, creations: bool = True) -> list[Future[Any]]:
        with self._lock:
            return [*(self._creations if creations else ()), *self._cleanups]

    async def create(self, kwargs: dict[str, Any], *, timeout: float) -> str:  # noqa: ASYNC109 (bounds a thread)
        """The id of a started container; on any failure or cancellation none is left."""
        creation = Creation()
        future: Future[str] = self._executor.submit(self._invoke, lambda c: create_and_start(c, kwargs, creation))
        self._track(future, creation)
        try:
            # Not asyncio.wait_for: on 3.11 a cancel that arrives once the thread has finished is
            # swallowed (the result is returned and the caller carries on as if never cancelled).
            async with asyncio.timeout(timeout):
                return await asyncio.wrap_future(future)
        except BaseException as exc:
            if handed_over := creation.abandon():
                self.remove_later(handed_over)
            if isinstance(exc, TimeoutError):
                raise EngineUnavailable(f"the Docker engine did not answer within {timeout:g}s") from exc
            if isinstance(exc, Abandoned):
                raise EngineUnavailable("the sandbox engine closed while the sandbox was being created") from exc
            raise

    def remove_later(self, container_id: str) -> None:
        """Remove a container nobody holds, in the background; `drain` waits for it."""

        def remove() -> None:
            with contextlib.suppress(Exception):
                self._invoke(lambda c: remove_container(c, container_id))

        try:
            future = self._executor.submit(remove)
        except RuntimeError:  # the pool is shut down: a thread of its own (joined at exit)
            threading.Thread(target=remove, name="forgehand-docker-cleanup").start()
            return
        self._track(future)

    async def settle(self, grace: float) -> None:
        """Wait up to `grace` seconds for the background removals queued so far."""
        if pending := self._pending(creations=False):
            await asyncio.to_thread(futures_wait, pending, grace)

    async def drain(self, grace: float) -> None:
        """Abandon every creation in flight and wait up to `grace` seconds for them and the removals."""
        self.closed = True
        # Not cancelled: a creation that has not begun sees itself abandoned and creates nothing.
        with self._lock:
            creations = list(self._creations.values())
        for creation in creations:
            if handed_over := creation.abandon():
                self.remove_later(handed_over)
        if pending := self._pending():
            await asyncio.to_thread(futures_wait, pending, grace)
        # Removals queued by callers that resumed meanwhile.
        await self.settle(grace)
