"""The back-channel in tests: a `Backchannel` for a task of the app under test (its database,
bus and gate, as the worker would build one), an MCP client speaking JSON-RPC over the run's
socket, and a loopback TCP port forwarding to that socket (what the sandbox's gateway relay is to
an agent in a container, for the real CLI on the host)."""

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import httpx
from litestar import Litestar
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from forge.db.engine import Database
from tasks.core.lifecycle import Lifecycle
from tasks.core.models import Run, Task
from tasks.run.backchannel import Backchannel
from tests.support.gateway import Recorder

RUNTIMES = frozenset({"builtin", "command", "claude-code"})


async def backchannel_for(
    app: Litestar, db: Database, number: int, *, remaining: int | None = None, **kw: Any
) -> Backchannel:
    """The back-channel of task `number`'s latest run (ana/demo), with a `Recorder` as its emit.
    `db`: the test's own database handle on the test's event loop (the app's runs on the test
    client's loop, and an asyncpg connection belongs to the loop that opened it)."""
    system = app.state.tasks
    async with db.session() as s:
        task = (await s.execute(select(Task).where(Task.number == number))).scalar_one()
        run = (await s.execute(select(Run).where(Run.task_id == task.id).order_by(Run.seq.desc()))).scalars().first()
        assert run is not None

    def lifecycle(session: AsyncSession) -> Lifecycle:
        return Lifecycle(session, bus=system.bus, base_url=system.settings.effective_base_url, gate=system.gate,
                         changed=system.hub.notify)  # fmt: skip

    return Backchannel(
        db=db,
        lifecycle=lifecycle,
        settings=kw.pop("settings", system.settings),
        task_id=task.id,
        run_id=run.id,
        emit=kw.pop("emit", Recorder()),
        runtimes=kw.pop("runtimes", RUNTIMES),
        remaining=lambda: remaining,
        **kw,
    )


class McpClient:
    """JSON-RPC requests to /mcp as an agent's MCP client sends them."""

    def __init__(self, http: httpx.AsyncClient, token: str, backchannel: Any = None) -> None:
        """`backchannel`: grant each `tool` call first, as the agent's policy broker does when
        pre_tool_use allows an MCP call (without a grant the server runs nothing)."""
        self.backchannel = backchannel
        self.http = http
        self.headers = {"authorization": f"Bearer {token}", "accept": "application/json, text/event-stream"}
        self._ids = itertools.count(1)

    async def post(self, body: Any, **headers: str) -> httpx.Response:
        return await self.http.post("/mcp", json=body, headers={**self.headers, **headers})

    async def request(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        r = await self.post({"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params or {}})
        assert r.status_code == 200 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
        body: dict[str, Any] = r.json()
        return body

    async def tool(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """(the text, isError) of a tools/call."""
        if self.backchannel is not None:
            self.backchannel.grant(name, arguments)
        body = await self.request("tools/call", {"name": name, "arguments": arguments})
        result = body["result"]
        return "".join(c["text"] for c in result["content"]), bool(result["isError"])


@contextlib.asynccontextmanager
async def tcp_to_socket(socket_path: str) -> AsyncIterator[int]:
    """A loopback TCP port whose connections are piped to the Unix socket `socket_path`."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_unix_connection(socket_path)
        await asyncio.gather(pipe(client_r, up_w), pipe(up_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
