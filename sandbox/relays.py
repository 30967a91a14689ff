"""Starting a sandbox's relays (`SandboxSpec.relays`): loopback TCP listeners in the container that
forward to the run's channel sockets.

One exec, as the sandbox user, runs a small launcher with the image's python3 (the plain image has
it; the agents image is built FROM it). The launcher starts each relay as a process of its own
session, detached from the exec (it outlives the launcher, reparented to the container's init), then
waits until every port listens on 127.0.0.1, which it reads from /proc/net/tcp rather than by
connecting, so that no probe reaches the socket behind. A relay that exits or does not listen in
time fails the start, with its own error. The relay is relay_main.py, whose text
(RELAY_SCRIPT) this passes, so every image runs the same one.
"""

from collections.abc import Sequence
from pathlib import Path

from .errors import RelayFailed
from .protocols import StartedSandbox
from .spec import Relay

READY_SECONDS = 5.0

# The relay itself (relay_main.py, stdlib Python 3.11), passed as text at exec time; the agents image
# also carries it as `forgehand-relay` (images/agent_files.py), so one script moves every byte in and
# out of a sandbox.
RELAY_SCRIPT = (Path(__file__).parent / "relay_main.py").read_text(encoding="utf-8")

# argv: RELAY_SCRIPT DEADLINE PORT PATH [PORT PATH ...]. Prints "ok" or one line saying what failed.
_LAUNCHER = """\
import os, subprocess, sys, time
script, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])
pairs = list(zip(sys.argv[3::2], sys.argv[4::2]))
procs = {}
def listening():
    found = set()
    try:
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) > 3 and parts[3] == "0A" and parts[1].startswith("0100007F:"):
                    found.add(str(int(parts[1].split(":")[1], 16)))
    except OSError:
        pass
    return found
taken = [port for port, _ in pairs if port in listening()]
if taken:
    print("port(s) %s already in use in the container" % ", ".join(taken))
    sys.exit(3)
for port, path in pairs:
    log = open("/tmp/.forgehand-relay-%s.log" % port, "wb")
    procs[port] = (subprocess.Popen(
        [sys.executable, "-I", "-c", script, port, path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        start_new_session=True, close_fds=True,
    ), log.name)
    log.close()
while True:
    up = listening()
    if all(port in up for port in procs):
        print("ok")
        sys.exit(0)
    for port, (proc, log) in procs.items():
        if port not in up and proc.poll() is not None:
            with open(log, "rb") as f:
                err = f.read(600).decode("utf-8", "replace").strip().splitlines()
            print("relay on port %s exited (%s): %s" % (port, proc.returncode, err[-1] if err else "no output"))
            sys.exit(3)
    if time.monotonic() > deadline:
        print("relay on port(s) %s not listening after %ss" % (
            ", ".join(p for p in procs if p not in up), sys.argv[2]))
        sys.exit(3)
    time.sleep(0.01)
"""


def launcher_argv(relays: Sequence[Relay], ready_seconds: float = READY_SECONDS) -> list[str]:
    """The one exec (as the sandbox user) that starts `relays` and prints "ok" once all listen."""
    argv = ["python3", "-I", "-c", _LAUNCHER, RELAY_SCRIPT, f"{ready_seconds:g}"]
    for relay in relays:
        argv += [str(relay.port), relay.socket_path]
    return argv


def check_launched(image: str, code: int | None, out: bytes) -> None:
    """RelayFailed unless the launcher (`launcher_argv`) said "ok"."""
    if code == 0 and out.strip() == b"ok":
        return
    if code in (126, 127):
        raise RelayFailed(f"the image {image} has no python3 to run the sandbox's relays")
    detail = out.decode("utf-8", "replace").strip() or f"the relay launcher exited with {code}"
    raise RelayFailed(f"a relay did not start: {detail}")


async def start_relays(sandbox: StartedSandbox, *, ready_seconds: float = READY_SECONDS) -> None:
    """Start every relay of the sandbox's spec and wait until each listens; RelayFailed otherwise."""
    relays = sandbox.spec.relays
    if not relays:
        return
    code, out = await sandbox.run_quiet(launcher_argv(relays, ready_seconds), timeout=ready_seconds + 10)
    check_launched(sandbox.spec.image, code, out)
