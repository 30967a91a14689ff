"""Egress test helpers: local origin servers (plain HTTP, HTTPS with a throwaway CA, a tiny
PyPI-style simple index serving a wheel built here), a raw client for the proxy's Unix socket, and
a proxy fixture builder that records what it reported."""

import asyncio
import base64
import contextlib
import hashlib
import http.server
import io
import socketserver
import ssl
import threading
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import trustme

from egress import Allowed, AllowedHosts, Blocked, Dialer, EgressProxy, RuleSet, Timeouts


@dataclass
class Origin:
    port: int
    requests: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)  # method, path, headers


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def _handler(files: dict[str, bytes], origin: Origin) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                out = bytearray()
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    out += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()  # the empty trailer
                return bytes(out)
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def _serve(self, body: bool) -> None:
            origin.requests.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
            received = self._body()
            if self.path == "/echo":
                data = received
            elif self.path in files:
                data = files[self.path]
            else:
                self.send_response(404)
                self.send_header("content-length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream" if not self.path.endswith("/") else "text/html")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            if body:
                view = memoryview(data)
                for i in range(0, len(view), 1 << 20):
                    self.wfile.write(view[i : i + (1 << 20)])

        def do_GET(self) -> None:
            self._serve(True)

        def do_HEAD(self) -> None:
            self._serve(False)

        def do_POST(self) -> None:
            self._serve(True)

    return Handler


@contextlib.contextmanager
def origin_server(
    files: dict[str, bytes], *, host: str = "127.0.0.1", tls: ssl.SSLContext | None = None
) -> Iterator[Origin]:
    """A threaded HTTP/1.1 server on `host`, a free port; `/echo` answers the request body."""
    origin = Origin(port=0)
    server = _Server((host, 0), _handler(files, origin))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    origin.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield origin
    finally:
        server.shutdown()
        server.server_close()


def throwaway_ca() -> tuple[trustme.CA, ssl.SSLContext]:
    """A throwaway CA and a server context for 127.0.0.1 and localhost signed by it."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return ca, context


def tiny_wheel(name: str = "forgehand_probe", version: str = "1.0") -> tuple[str, bytes]:
    """A valid pure-Python wheel (file name, bytes), built here: `pip download` accepts it."""
    dist = f"{name}-{version}"
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: forgehand-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record_lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record_lines.append(f"{path},sha256={digest},{len(data)}")
    record_lines.append(f"{dist}.dist-info/RECORD,,")
    files[f"{dist}.dist-info/RECORD"] = ("\n".join(record_lines) + "\n").encode()
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return f"{dist}-py3-none-any.whl", buffer.getvalue()


def simple_index(project: str = "forgehand-probe") -> dict[str, bytes]:
    """The files of a PEP 503 simple index with one project and its wheel."""
    wheel_name, wheel = tiny_wheel(project.replace("-", "_"))
    digest = hashlib.sha256(wheel).hexdigest()
    link = f'<a href="/packages/{wheel_name}#sha256={digest}">{wheel_name}</a>'
    return {
        "/simple/": f'<html><body><a href="/simple/{project}/">{project}</a></body></html>'.encode(),
        f"/simple/{project}/": f"<html><body>{link}</body></html>".encode(),
        f"/packages/{wheel_name}": wheel,
    }


@dataclass
class Recorded:
    proxy: EgressProxy
    blocked: list[Blocked]
    allowed: list[Allowed]


@contextlib.asynccontextmanager
async def running_proxy(
    socket_path: Path,
    rules: list[str] | None = None,
    *,
    presets: list[str] | None = None,
    allowed_hosts: str = "",
    timeouts: Timeouts | None = None,
    resolver: object = None,
) -> AsyncIterator[Recorded]:
    blocked: list[Blocked] = []
    allowed: list[Allowed] = []
    dialer = Dialer(AllowedHosts.parse(allowed_hosts))
    if resolver is not None:
        dialer.resolver = resolver  # type: ignore[assignment]
    proxy = EgressProxy(
        socket_path,
        RuleSet.build(rules or [], presets or []),
        dialer,
        on_blocked=blocked.append,
        on_allowed=allowed.append,
        timeouts=timeouts or Timeouts(),
    )
    await proxy.start()
    try:
        yield Recorded(proxy, blocked, allowed)
    finally:
        await proxy.close()


async def raw_exchange(socket_path: Path, data: bytes, *, timeout: float = 10.0) -> bytes:
    """Send `data` to the proxy, half-close, and return everything it answers until it closes."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


async def send_and_read(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    """Send `data` in 1 MiB pieces and half-close while reading everything that comes back (the
    peer may answer before the upload ends); the connection is closed after."""

    async def upload() -> None:
        for i in range(0, len(data), 1 << 20):
            writer.write(data[i : i + (1 << 20)])
            await writer.drain()
        writer.write_eof()

    sending = asyncio.ensure_future(upload())
    try:
        answer = await asyncio.wait_for(reader.read(), 30)
        await sending
    finally:
        sending.cancel()
        writer.close()
    return answer
