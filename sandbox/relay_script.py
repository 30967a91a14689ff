'''The relay every sandbox runs (relays.py starts it at exec time with the image's python3):
a TCP listener on the container's 127.0.0.1 whose connections go on to a channel socket.

It is the only way out of a sandbox (the egress proxy, the gateway), so it moves bytes the
cheapest way Python allows: a thread per direction splicing (splice(2)) from socket to kernel pipe
to socket, the bytes never copied into the process, with 4 MiB socket buffers; a plain copy where
the kernel does not splice. The agents image's `forgehand-relay` (agent_scripts.RELAY_SCRIPT) is
the older asyncio copy loop; it is baked into that image (its recipe digest), so it changes with
the next agents image version, not here.
'''

SANDBOX_RELAY_SCRIPT = '''\
#!/usr/bin/python3 -I
"""forgehand-relay LISTEN_PORT SOCKET_PATH: a TCP listener on 127.0.0.1 relayed to a Unix socket.

Port 0 picks a free port. Prints "127.0.0.1:PORT" on stdout once listening. Each connection opens
its own connection to the socket; bytes go both ways (spliced where the kernel can), half-closes
are passed on, a reset on one side ends both.
"""

import errno
import fcntl
import os
import socket
import sys
import threading

PIPE_SIZE = 1 << 20
BUFFER = 4 << 20
UNSUPPORTED = (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP)


class Unsupported(Exception):
    pass


def spliced(src, dst):
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        except OSError:
            pass
        first = True
        while True:
            try:
                n = os.splice(src.fileno(), write_end, PIPE_SIZE, flags=os.SPLICE_F_MOVE)
            except OSError as exc:
                if first and exc.errno in UNSUPPORTED:
                    raise Unsupported() from exc
                raise
            first = False
            if not n:
                return
            while n:
                n -= os.splice(read_end, dst.fileno(), n, flags=os.SPLICE_F_MOVE)
    finally:
        os.close(read_end)
        os.close(write_end)


def copied(src, dst):
    view = memoryview(bytearray(256 * 1024))
    while True:
        n = src.recv_into(view)
        if not n:
            return
        dst.sendall(view[:n])


def pump(src, dst):
    try:
        try:
            spliced(src, dst)
        except Unsupported:
            copied(src, dst)
    except OSError:
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def handle(client, path):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError as exc:
        sys.stderr.write("forgehand-relay: cannot reach %s: %s\\n" % (path, exc))
        sys.stderr.flush()
        upstream.close()
        client.close()
        return
    for sock in (client, upstream):
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, option, BUFFER)
            except OSError:
                pass
    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def main(port, path):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", port))
    server.listen(128)
    sys.stdout.write("127.0.0.1:%d\\n" % server.getsockname()[1])
    sys.stdout.flush()
    while True:
        client, _ = server.accept()
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=handle, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    if len(sys.argv) != 3 or not sys.argv[1].isdigit():
        sys.stderr.write("usage: forgehand-relay LISTEN_PORT SOCKET_PATH\\n")
        sys.exit(64)
    try:
        main(int(sys.argv[1]), sys.argv[2])
    except KeyboardInterrupt:
        pass
'''
