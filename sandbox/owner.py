"""Which process created a sandbox, and whether that process is provably gone.

Every container the engine creates carries two labels: `forgehand.host` (the creator's hostname)
and `forgehand.owner` = `<boot id>.<pid namespace>.<pid>.<process start time>`. From the same host
(same hostname) a reaper can tell, without any shared state, that the creator no longer exists:

- the boot id differs: the kernel has rebooted since, so every process of that boot is gone;
- same boot and pid namespace: the pid has no process, a zombie, or a process that started at
  another time (the pid was reused).

Anything else (another hostname, another pid namespace, a label missing or unreadable) is "not
provably gone", and such a container is left to its own instance's reaper. Hostnames must
therefore be unique among the hosts that share one Docker engine (docs/operator.md).
"""

import functools
import os
import socket
from pathlib import Path

import msgspec

LABEL_HOST = "forgehand.host"
LABEL_OWNER = "forgehand.owner"

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


class Owner(msgspec.Struct, frozen=True):
    host: str
    boot: str
    pidns: str
    pid: int
    start: str  # clock ticks after boot, field 22 of /proc/<pid>/stat

    def labels(self) -> dict[str, str]:
        return {LABEL_HOST: self.host, LABEL_OWNER: f"{self.boot}.{self.pidns}.{self.pid}.{self.start}"}


def _read(path: str) -> str:
    try:
        with Path(path).open(encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def process_start(pid: int) -> str | None:
    """The start time of a live process `pid` in our pid namespace; None when gone or a zombie."""
    stat = _read(f"/proc/{pid}/stat")
    # The command name (field 2) may contain spaces and parentheses: split after the last ")".
    fields = stat.rpartition(")")[2].split()
    if len(fields) < 20 or fields[0] in {"Z", "X"}:
        return None
    return fields[19]


def _pid_namespace() -> str:
    try:
        link = str(Path("/proc/self/ns/pid").readlink())  # "pid:[4026531836]"
    except OSError:
        return ""
    return "".join(ch for ch in link if ch.isdigit())


@functools.cache
def _owner_of(pid: int) -> Owner:
    return Owner(
        host=socket.gethostname(),
        boot=_read(_BOOT_ID).replace("-", ""),
        pidns=_pid_namespace(),
        pid=pid,
        start=process_start(pid) or "",
    )


def current_owner() -> Owner:
    """This process (cached per pid, so a forked child gets its own)."""
    return _owner_of(os.getpid())


def parse_owner(host: str, value: str) -> Owner | None:
    boot, _, rest = value.partition(".")
    pidns, _, rest = rest.partition(".")
    pid, _, start = rest.partition(".")
    if not (host and boot and pidns and pid.isdigit() and start.isdigit()):
        return None
    return Owner(host=host, boot=boot, pidns=pidns, pid=int(pid), start=start)


def creator_gone(labels: dict[str, str]) -> bool:
    """True only when the labels name a creator on this host that provably no longer runs."""
    owner = parse_owner(labels.get(LABEL_HOST, ""), labels.get(LABEL_OWNER, ""))
    me = current_owner()
    if owner is None or owner.host != me.host or not me.boot:
        return False
    if owner.boot != me.boot:
        return True
    if owner.pidns != me.pidns or not me.pidns:
        return False
    if owner.pid == me.pid:
        return owner.start != me.start
    return process_start(owner.pid) != owner.start
