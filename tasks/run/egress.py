"""A run's egress proxy (egress/), when its repository allows network access: started on the
run's channel directory before the sandbox (next to gateway.sock; a run without a gateway gets the
directory to itself), closed with the run whatever its ending.

The sandbox keeps network none. It gets the relay 127.0.0.1:3128 -> egress.sock and
HTTP(S)_PROXY pointing at it in the container's environment, so every process uses it (builtin's
tool commands and the CLIs alike); NO_PROXY is empty. The container's other loopback relays (the
gateway's, 127.0.0.1:4100) are reached through the proxy too, straight to their sockets: a client
that sends everything to the proxy still finds the run's own channel.

Each refusal becomes an `egress_blocked` transcript event and an `egress.blocked` notification
(the first `RECORDED_REFUSALS` of a run; the rest are counted, with one notice); the counts go
on the run when it ends.
"""

import asyncio
import contextlib
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import structlog

from egress import SOCKET_NAME, Allowed, Blocked, Dialer, EgressProxy
from forge.db import events
from forge.db.models import Repository
from sandbox import CHANNEL_DIR, EGRESS_PROXY_PORT, GATEWAY_RELAY_PORT, Relay
from tasks.core.egress_config import EgressPlan
from tasks.core.models import Run, Task
from tasks.core.transcript import EgressBlocked, Kind, Notice, Payload
from tasks.run.env import RunEnv
from tasks.run.gateway.channel import channel_name, check_channel_root

log = structlog.get_logger("forgehand.egress")

RECORDED_REFUSALS = 100
PROXY_URL = f"http://127.0.0.1:{EGRESS_PROXY_PORT}"
Emit = Callable[[Kind, Payload], Awaitable[None]]
Notify = Callable[[Blocked], Awaitable[None]]


def proxy_env() -> dict[str, str]:
    """The container's environment for egress: every client that honours the proxy variables."""
    return {
        "HTTP_PROXY": PROXY_URL,
        "HTTPS_PROXY": PROXY_URL,
        "http_proxy": PROXY_URL,
        "https_proxy": PROXY_URL,
        "NO_PROXY": "",
        "no_proxy": "",
    }


class RunEgress:
    """The proxy of one run and the reporting of what it refused."""

    def __init__(
        self, plan: EgressPlan, host_dir: Path, *, emit: Emit, notify: Notify, owns_dir: bool, phase: str = "run"
    ) -> None:
        self.plan = plan
        self.phase = phase  # "environment": the proxy of an environment's setup
        self.host_dir = host_dir
        self.owns_dir = owns_dir
        self._emit = emit
        self._notify = notify
        self._queue: asyncio.Queue[Blocked | None] = asyncio.Queue()
        self._reporter: asyncio.Task[None] | None = None
        self._closed = False
        loopback = {GATEWAY_RELAY_PORT: host_dir / "gateway.sock"}
        self.proxy = EgressProxy(
            host_dir / SOCKET_NAME,
            plan.rules,
            Dialer(plan.allowed_hosts, loopback_sockets=loopback),
            on_blocked=self._queue.put_nowait,
            on_allowed=self._allowed,
        )

    @property
    def relay(self) -> Relay:
        return Relay(EGRESS_PROXY_PORT, SOCKET_NAME)

    @property
    def allowed(self) -> int:
        return self.proxy.stats.allowed

    @property
    def blocked(self) -> int:
        return self.proxy.stats.blocked

    def describe(self) -> str:
        presets = f" and presets {', '.join(self.plan.presets)}" if self.plan.presets else ""
        return (
            f"egress through the proxy at {PROXY_URL} ({CHANNEL_DIR}/{SOCKET_NAME}): "
            f"{len(self.plan.repo_rules)} repository rules{presets}"
        )

    async def start(self) -> None:
        if self.owns_dir:
            await asyncio.to_thread(self.host_dir.mkdir, 0o755, False, True)
            await asyncio.to_thread(self.host_dir.chmod, 0o755)
        await self.proxy.start()
        self._reporter = asyncio.ensure_future(self._report())

    async def close(self) -> None:
        """Stop the proxy (every tunnel ends), report what is still queued, remove what it made."""
        if self._closed:
            return
        self._closed = True
        await self.proxy.close()
        self._queue.put_nowait(None)
        if self._reporter is not None:
            try:
                async with asyncio.timeout(10):
                    await asyncio.shield(self._reporter)
            except (TimeoutError, Exception):
                self._reporter.cancel()
                log.warning("egress refusals were not all recorded in time", blocked=self.blocked)
        if self.owns_dir:
            await asyncio.to_thread(shutil.rmtree, self.host_dir, True)

    def _allowed(self, allowed: Allowed) -> None:
        log.debug("egress allowed", host=allowed.host, port=allowed.port, method=allowed.method, rule=allowed.rule)

    async def _report(self) -> None:
        recorded = 0
        while (blocked := await self._queue.get()) is not None:
            recorded += 1
            if recorded > RECORDED_REFUSALS:
                if recorded == RECORDED_REFUSALS + 1:
                    text = f"more than {RECORDED_REFUSALS} egress refusals: the rest are counted, not recorded"
                    with contextlib.suppress(Exception):
                        await self._emit("notice", Notice(text=text, level="warning"))
                continue
            target = f"{blocked.host}:{blocked.port}" if blocked.host else "a request"
            during = "during the environment's setup: " if self.phase == "environment" else ""
            what = f"{blocked.method or 'a request'} {target} ({blocked.rules})"
            event = EgressBlocked(
                text=f"{during}egress refused {what}: {blocked.reason}",
                host=blocked.host,
                port=blocked.port,
                method=blocked.method,
                rules=blocked.rules,
                reason=blocked.reason[:500],
                phase=self.phase,
            )
            try:
                await self._emit("egress_blocked", event)
                await self._notify(blocked)
            except Exception:
                log.warning("an egress refusal was not recorded", exc_info=True)


async def open_run_egress(
    plan: EgressPlan,
    channel_dir: Path | None,
    root: Path,
    run_uuid: str,
    *,
    emit: Emit,
    notify: Notify,
    phase: str = "run",
) -> RunEgress:
    """Start the run's proxy in its channel directory (`channel_dir`, the gateway's), or in a
    directory of its own under the channel root when the run has no gateway."""
    owns = channel_dir is None
    if channel_dir is None:
        channel_dir = root / channel_name(run_uuid)
        await asyncio.to_thread(_fresh_dir, root, channel_dir)
    egress = RunEgress(plan, channel_dir, emit=emit, notify=notify, owns_dir=owns, phase=phase)
    await egress.start()
    return egress


def _fresh_dir(root: Path, channel_dir: Path) -> None:
    root.mkdir(mode=0o755, parents=True, exist_ok=True)
    check_channel_root(root)
    if channel_dir.exists():  # a crashed worker's (run uuids are unique)
        shutil.rmtree(channel_dir, ignore_errors=True)


def blocked_notifier(env: RunEnv, task_id: int, repo_id: int, run_id: int, phase: str = "run") -> Notify:
    """Publish each refusal as an `egress.blocked` notification (its own short transaction)."""

    async def notify(blocked: Blocked) -> None:
        async with env.db.session(write=True) as s:
            task, repo, run = await s.get(Task, task_id), await s.get(Repository, repo_id), await s.get(Run, run_id)
            if task is None or repo is None or run is None:
                return
            data = events.EgressBlocked(
                host=blocked.host,
                port=blocked.port,
                method=blocked.method,
                rules=cast(Any, blocked.rules),
                reason=blocked.reason[:500],
                phase=cast(Any, phase),
            )
            await env.lifecycle(s).publish("egress.blocked", task, repo, run=run, data=data)

    return notify
