#!/usr/bin/python3 -I
"""forgehand-relay LISTEN_PORT SOCKET_PATH: a TCP listener on 127.0.0.1 relayed to a Unix socket.

Port 0 picks a free port. Prints "127.0.0.1:PORT" on stdout once listening. Each connection opens
its own connection to the socket; bytes go both ways, half-closes are passed on, a reset on one
side ends both.

This file is the relay every sandbox runs: relays.py passes its text to the image's python3 (3.11,
stdlib only) at exec time. It is a sandbox's only way out (the egress proxy, the gateway), so it
moves bytes the cheapest way Python allows: one thread and one selector for every connection
(nothing started per connection), each direction spliced (splice(2)) from socket to a kernel pipe
to socket, never copied into the process, with 4 MiB socket buffers; copied through a buffer
where the kernel does not splice. The agents image carries the same text as `forgehand-relay`
(agent_scripts.RELAY_SCRIPT).
"""

import contextlib
import errno
import fcntl
import os
import selectors
import socket
import sys
import time

PIPE_SIZE = 1 << 20
BUFFER = 4 << 20
COPY_SIZE = 256 * 1024
FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class Direction:
    """src to dst: bytes read wait in a kernel pipe (or a buffer) until dst takes them."""

    def __init__(self, src: socket.socket, dst: socket.socket) -> None:
        self.src, self.dst = src, dst
        self.pending = 0  # read from src, not yet written to dst
        self.ended = False  # src has ended
        self.done = False  # ... and dst has had everything and the half-close
        self.read_end, self.write_end = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):
            fcntl.fcntl(self.write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        self.buffer: memoryview | None = None  # once the kernel refused to splice
        self.offset = 0

    def wants_read(self) -> bool:
        return not self.ended and not self.pending

    def read(self) -> None:
        try:
            if self.buffer is None:
                n = os.splice(self.src.fileno(), self.write_end, PIPE_SIZE, flags=FLAGS)
            else:
                n = self.src.recv_into(self.buffer)
        except BlockingIOError:
            return
        except OSError as exc:
            if self.buffer is not None or exc.errno not in UNSUPPORTED:
                raise
            self.buffer = memoryview(bytearray(COPY_SIZE))
            return
        if n:
            self.pending, self.offset = n, 0
        else:
            self.ended = True
        self.write()

    def write(self) -> None:
        while self.pending:
            try:
                if self.buffer is None:
                    sent = os.splice(self.read_end, self.dst.fileno(), self.pending, flags=FLAGS)
                else:
                    sent = self.dst.send(self.buffer[self.offset : self.offset + self.pending])
            except BlockingIOError:
                return
            self.pending -= sent
            self.offset += sent
        if self.ended and not self.done:
            self.done = True
            with contextlib.suppress(OSError):
                self.dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        os.close(self.read_end)
        os.close(self.write_end)


class Connection:
    def __init__(self, selector: selectors.BaseSelector, client: socket.socket, upstream: socket.socket) -> None:
        self.selector = selector
        self.client, self.upstream = client, upstream
        self.out = Direction(client, upstream)
        self.back = Direction(upstream, client)
        self.events: dict[socket.socket, int] = {client: 0, upstream: 0}
        self.closed = False
        self.update()

    def ready(self, sock: socket.socket, mask: int) -> None:
        try:
            # A socket is the source of one direction and the destination of the other.
            mine, other = (self.out, self.back) if sock is self.client else (self.back, self.out)
            if mask & selectors.EVENT_WRITE:
                other.write()
            if mask & selectors.EVENT_READ and mine.wants_read():
                mine.read()
        except OSError:
            self.close()
            return
        if self.out.done and self.back.done:
            self.close()
        else:
            self.update()

    def update(self) -> None:
        for sock, mine, other in ((self.client, self.out, self.back), (self.upstream, self.back, self.out)):
            events = (selectors.EVENT_READ if mine.wants_read() else 0) | (
                selectors.EVENT_WRITE if other.pending else 0
            )
            if events == self.events[sock]:
                continue
            if not self.events[sock]:
                self.selector.register(sock, events, self)
            elif not events:
                self.selector.unregister(sock)
            else:
                self.selector.modify(sock, events, self)
            self.events[sock] = events

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock, events in self.events.items():
            if events:
                self.selector.unregister(sock)
            sock.close()
        self.out.close()
        self.back.close()


def widen(sock: socket.socket) -> None:
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, BUFFER)


def accept(selector: selectors.BaseSelector, server: socket.socket, path: str) -> None:
    while True:
        try:
            client, _ = server.accept()
        except BlockingIOError:
            return
        except OSError as exc:  # out of descriptors or memory: the relay lives on, the client waits
            sys.stderr.write(f"forgehand-relay: cannot accept: {exc}\n")
            sys.stderr.flush()
            time.sleep(0.05)  # the listener stays readable: do not spin until a descriptor frees
            return
        upstream = None
        try:
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.settimeout(5)  # a Unix connect waits only when the listener's backlog is full
            upstream.connect(path)
        except OSError as exc:
            sys.stderr.write(f"forgehand-relay: cannot reach {path}: {exc}\n")
            sys.stderr.flush()
            if upstream is not None:
                upstream.close()
            client.close()
            continue
        for sock in (client, upstream):
            sock.setblocking(False)
        widen(upstream)
        Connection(selector, client, upstream)


def main(port: int, path: str) -> None:
    selector = selectors.DefaultSelector()
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    server.setblocking(False)
    selector.register(server, selectors.EVENT_READ, None)
    sys.stdout.write(f"127.0.0.1:{server.getsockname()[1]}\n")
    sys.stdout.flush()
    while True:
        for key, mask in selector.select():
            if key.data is None:
                accept(selector, server, path)
            else:
                key.data.ready(key.fileobj, mask)


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[1].isdigit():
        sys.stderr.write("usage: forgehand-relay LISTEN_PORT SOCKET_PATH\n")
        sys.exit(64)
    with contextlib.suppress(KeyboardInterrupt):
        main(int(sys.argv[1]), sys.argv[2])
