"""What the webhooks tests share: real HTTP receivers on 127.0.0.1, a canary listener, a
controllable clock, repositories and endpoints made through the real services, and `Rig` (a
clock-controlled outbox writer and deliverer on one database)."""

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler
from typing import Any

from sqlalchemy import select

from forge.core.settings import Settings
from forge.core.urlguard import AllowList
from forge.db.audit import Actor
from forge.db.engine import Database, utcnow
from forge.db.events import Event, EventBus, EventPayload, TaskCreated, TaskRef, TaskStateChanged
from forge.db.models import Account, Repository
from tests.support.http import LoopbackServer
from webhooks.core.config import WebhooksConfig
from webhooks.core.models import WebhookDelivery, WebhookEndpoint, WebhookOutbox
from webhooks.core.outbound import Outbound
from webhooks.core.schemas import HookCreate
from webhooks.delivery.deliverer import Deliverer
from webhooks.delivery.outbox import OutboxWriter
from webhooks.service import create_endpoint

LOOPBACK = AllowList.parse("127.0.0.1")


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float  # time.monotonic()


class Drop(Exception):
    """Raised by a responder: close the connection without answering."""


Responder = Callable[[Seen], tuple[int, list[tuple[str, str]], bytes]]


def ok_empty(_: Seen) -> tuple[int, list[tuple[str, str]], bytes]:
    return 200, [], b""


@dataclass
class Receiver:
    """A real HTTP server on 127.0.0.1 in a thread; records every request and connection."""

    respond: Responder = ok_empty
    host: str = "127.0.0.1"
    port: int = 0
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    receiving: int = 0  # requests whose head arrived and that are not recorded in `seen` yet
    _server: LoopbackServer | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/hook"

    def start(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                with receiver._lock:
                    receiver.receiving += 1
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(length) if length else b""
                    item = Seen(
                        self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body, time.monotonic()
                    )
                    with receiver._lock:
                        receiver.seen.append(item)
                finally:
                    with receiver._lock:
                        receiver.receiving -= 1
                try:
                    status, headers, payload = receiver.respond(item)
                except Drop:
                    self.close_connection = True
                    return
                self.send_response(status)
                for k, v in headers:
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST  # noqa: N815

        class Server(LoopbackServer):
            daemon_threads = True
            block_on_close = False

            def get_request(self) -> tuple[socket.socket, Any]:
                conn = super().get_request()
                with receiver._lock:
                    receiver.connections += 1
                return conn

        self._server = Server((self.host, self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


@contextmanager
def receiver(respond: Responder = ok_empty, *, host: str = "127.0.0.1", port: int = 0) -> Iterator[Receiver]:
    r = Receiver(respond=respond, host=host, port=port).start()
    try:
        yield r
    finally:
        r.stop()


class Canary:
    """A bare TCP listener that counts connection attempts (it must see none)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket()
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


class Clock:
    """A controllable UTC clock for the outbox (attempt times, leases, auto-disable)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> None:
        self.now += timedelta(**delta)


def config(settings: Settings, **overrides: Any) -> WebhooksConfig:
    values: dict[str, Any] = {"allow": LOOPBACK}
    values.update(overrides)
    return WebhooksConfig.from_settings(settings, **values)


def outbound(cfg: WebhooksConfig, **kw: Any) -> Outbound:
    return Outbound(cfg.allow, **kw)


async def make_repo(db: Database, owner_login: str = "ana", name: str = "demo") -> Repository:
    from forge.accounts import accounts
    from forge.accounts.accounts import get_by_login

    async with db.session(write=True) as s:
        owner = await get_by_login(s, owner_login)
        if owner is None:
            owner = await accounts.create_user(s, Actor.system("test"), owner_login, "correct horse battery")
        repo = Repository(owner_id=owner.id, name=name, name_key=name.lower(), visibility="private")
        s.add(repo)
        await s.flush()
        repo_id = repo.id
    async with db.session() as s:
        loaded = await s.get(Repository, repo_id)
        assert loaded is not None
        return loaded


async def owner_of(db: Database, repo: Repository) -> Account:
    async with db.session() as s:
        account = await s.get(Account, repo.owner_id)
        assert account is not None
        return account


async def make_endpoint(
    db: Database,
    cfg: WebhooksConfig,
    repo: Repository | None,
    url: str,
    *,
    kind: str = "notify",
    events: list[str] | None = None,
    failure_policy: str = "closed",
) -> tuple[WebhookEndpoint, str]:
    events = events or (["task.created", "task.state_changed", "repo.pushed"] if kind == "notify" else ["pre_tool_use"])
    async with db.session(write=True) as s:
        endpoint, secret = await create_endpoint(
            s,
            Actor.system("test"),
            cfg,
            repo,
            HookCreate(url=url, kind=kind, events=events, failure_policy=failure_policy),  # type: ignore[arg-type]
        )
    return endpoint, secret


def task_ref() -> TaskRef:
    return TaskRef(id=str(uuid.uuid4()), number=1)


def event(repo: Repository, payload: EventPayload | None = None, task: TaskRef | None = None) -> Event:
    return Event(
        repo_id=repo.id, repo_uuid=repo.uuid, repository=f"ana/{repo.name}", task=task, data=payload or TaskCreated()
    )


def numbered(step: int) -> TaskStateChanged:
    """A state change numbered by its queue position, so order checks can read the number back."""
    return TaskStateChanged(from_="queued", to="queued", queue_position=step)


class Rig:
    """A clock-controlled writer and deliverer on one database."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.clock = Clock()
        self.cfg: WebhooksConfig = config(settings, clock=self.clock)
        self.bus = EventBus()
        self.woken = 0
        self.bus.subscribe(OutboxWriter(self.cfg, wake=self._wake))
        self.out = Outbound(self.cfg.allow)
        self.deliverer = Deliverer(db, self.cfg, self.out)

    async def __aenter__(self) -> "Rig":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.out.aclose()

    def _wake(self) -> None:
        self.woken += 1

    async def publish(self, *events: Event) -> None:
        async with self.db.session(write=True) as s:
            for e in events:
                await self.bus.publish(s, e)

    async def drain(self) -> int:
        """Deliver until nothing is due now."""
        total = 0
        while n := await self.deliverer.run_once():
            total += n
        return total

    async def rows(self) -> list[WebhookOutbox]:
        async with self.db.session() as s:
            return list((await s.execute(select(WebhookOutbox).order_by(WebhookOutbox.id))).scalars())

    async def log(self) -> list[WebhookDelivery]:
        async with self.db.session() as s:
            return list((await s.execute(select(WebhookDelivery).order_by(WebhookDelivery.id))).scalars())

    async def endpoint(self, endpoint_id: int) -> WebhookEndpoint:
        async with self.db.session() as s:
            e = await s.get(WebhookEndpoint, endpoint_id)
            assert e is not None
            return e
