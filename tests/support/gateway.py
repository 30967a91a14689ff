"""Run channels for tests: a `RunChannel` on a short socket directory (Unix socket paths are
limited to 107 bytes, pytest's tmp_path can be longer), the upstreams pointed at scripted servers,
and an httpx client that talks to the channel's socket as an agent in the sandbox would."""

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from forge.core.urlguard import AllowSource
from tasks.run.gateway import PriceTable, ProviderInfo, RunChannel, Upstream
from tasks.run.gateway.guard import allow_list
from tasks.run.gateway.limits import CallLimits

ANTHROPIC_KEY = "sk-ant-real-key-0123456789abcdef"
OPENAI_KEY = "sk-openai-real-key-0123456789abcdef"


def upstreams(
    *, anthropic_url: str = "", openai_url: str = "", timeout: float = 10.0, guarded: bool = False
) -> dict[str, Upstream]:
    """`guarded`: the endpoints are a repository's or a person's (checked by the URL guard)."""
    out = {}
    if anthropic_url:
        out["anthropic"] = Upstream(
            provider="anthropic",
            base_url=anthropic_url,
            api_key=ANTHROPIC_KEY,
            model="claude-test",
            timeout=timeout,
            guarded=guarded,
        )
    if openai_url:
        out["openai"] = Upstream(
            provider="openai",
            base_url=openai_url,
            api_key=OPENAI_KEY,
            model="scripted",
            timeout=timeout,
            guarded=guarded,
        )
    return out


class Recorder:
    """The channel's emit callback: what a run's transcript would get."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def __call__(self, kind: str, payload: Any) -> None:
        self.events.append((kind, payload))

    def model_calls(self) -> list[Any]:
        return [p for k, p in self.events if k == "model_call"]


@asynccontextmanager
async def open_channel(
    ups: dict[str, Upstream],
    *,
    task_id: int = 1,
    run_id: int = 1,
    token_budget: int = 0,
    prices: PriceTable | None = None,
    emit: Any = None,
    root: Path | None = None,
    allow_web_search: bool = False,
    allowed_hosts: str | AllowSource = "",
    call_limits: CallLimits | None = None,
) -> AsyncIterator[RunChannel]:
    base = root or Path(tempfile.mkdtemp(prefix="fhg-", dir="/tmp"))
    channel = RunChannel(
        root=base,
        task_id=task_id,
        run_id=run_id,
        run_uuid=str(uuid.uuid4()),
        upstreams=ups,
        provider=ProviderInfo(
            anthropic_model="claude-test", openai_model="scripted", allow_web_search=allow_web_search
        ),
        token_budget=token_budget,
        prices=prices or PriceTable({}),
        emit=emit,
        allowed_hosts=allow_list(allowed_hosts) if isinstance(allowed_hosts, str) else allowed_hosts,
        call_limits=call_limits,
    )
    await channel.start()
    try:
        yield channel
    finally:
        await channel.close()
        if root is None:
            shutil.rmtree(base, ignore_errors=True)


def agent_client(channel: RunChannel, *, timeout: float = 30.0) -> httpx.AsyncClient:
    """What the agent inside the sandbox holds: the socket and the run token, no provider key."""
    return httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(channel.socket_path)),
        base_url="http://localhost",
        timeout=timeout,
    )
