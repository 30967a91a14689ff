"""A free TCP port on 127.0.0.1 for a server a test starts (in a thread or a subprocess).

Not `bind(0)`: the kernel hands that port out again as the local port of any outgoing
connection, and between the test closing its probe socket and the server binding it, one of the
thousands of connections the parallel suite opens can take it ("address already in use"). A port
below the kernel's ephemeral range is never given to an outgoing connection; chosen at random and
checked, two workers meet on one only by a rare coincidence.
"""

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10000


def _ephemeral_start() -> int:
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nobody listens on now, outside the range outgoing connections take theirs from."""
    high = _ephemeral_start()
    if high - _LOWEST < 1000:  # an unusual range: the kernel's choice is the best there is
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(_LOWEST, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port between {_LOWEST} and {high}")
