"""A CPU budget for a group of processes on this machine: a cgroup with a CPU quota (cgroup v1's
`cpu` controller, or v2's `cpu.max`), standing in for a host with that many CPUs.

Why: the scale-out bench runs two "worker hosts" (a Docker engine and its worker each) and the
shared services (PostgreSQL, the replicas) on one 2-CPU machine. Pinned to a CPU each, the hosts
still give CPU to the shared services, and only when both hosts are busy, so the two-host figure
pays for the database and replicas while the one-host figure does not. A quota per host keeps
each host at its own budget whatever the others do, and leaves the rest of the machine to the
shared services, as a third machine would.

A process is moved with all its threads (`cgroup.procs`); the processes it starts later are born
in the budget (a dockerd's containerd, its shims and runc; a worker's git and mount). Containers
are not: their engine puts them in cgroups of their own. Leaving the budget moves every process
still in it back to the root and removes the cgroup. Needs root.
"""

import contextlib
from collections.abc import Iterator
from pathlib import Path

ROOT_V1 = Path("/sys/fs/cgroup/cpu")
ROOT_V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class CpuBudget:
    def __init__(self, root: Path, path: Path) -> None:
        self.root = root
        self.path = path

    def add(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (self.path / "cgroup.procs").write_text(f"{pid}\n")


def _root() -> tuple[Path, bool]:
    if (ROOT_V1 / "cpu.cfs_quota_us").exists():
        return ROOT_V1, True
    if (ROOT_V2 / "cgroup.controllers").exists():
        return ROOT_V2, False
    raise RuntimeError("no cgroup cpu controller at /sys/fs/cgroup (v1 `cpu` or v2 `cpu.max`)")


@contextlib.contextmanager
def cpu_budget(name: str, cpus: float) -> Iterator[CpuBudget]:
    """A budget of `cpus` CPUs (a quota per 100 ms period, spent on any CPU) named `name`."""
    root, v1 = _root()
    if not v1:
        controllers = (root / "cgroup.subtree_control").read_text().split()
        if "cpu" not in controllers:
            (root / "cgroup.subtree_control").write_text("+cpu\n")
    path = root / name
    path.mkdir(exist_ok=True)
    quota = int(cpus * PERIOD_US)
    if v1:
        (path / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
        (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    else:
        (path / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
    budget = CpuBudget(root, path)
    try:
        yield budget
    finally:
        _release(budget)


def _release(budget: CpuBudget) -> None:
    for _ in range(10):  # a process may be forking while its family is moved out
        pids = [int(p) for p in (budget.path / "cgroup.procs").read_text().split()]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                (budget.root / "cgroup.procs").write_text(f"{pid}\n")
    budget.path.rmdir()
