"""Moving a warm pool slot's directories onto a run's own paths (see pool.py), on the host.

A started container keeps the directories bound at its creation; what can change is where the host
finds them. A plain directory is renamed (a bind follows the directory, not its path). A quota
mount cannot be renamed (rename(2) refuses a mount point): its filesystem is bound at the run's path
and the slot's mount let go, and its image file is renamed beside the run's workspace, where
`remove_workspace` looks for it. Both paths must be on the same filesystem. Blocking."""

import contextlib
from pathlib import Path

from .quota import is_mounted, move_quota_mount


def move_workspace(slot: Path, target: Path) -> None:
    """Make the slot's workspace (a directory or a quota mount) the workspace at `target`, which
    must not exist yet or be an empty directory; the slot's path is gone afterwards."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if not is_mounted(slot):
        with contextlib.suppress(OSError):
            target.rmdir()  # an empty directory is replaced; a full one makes the rename fail
        slot.rename(target)
        return
    move_quota_mount(slot, target)


def adopt_channel(slot: Path, target: Path) -> None:
    """Make the slot's channel directory the run's channel directory `target`: the sockets the run
    made there move in (a bound socket follows its file), then the slot's directory takes the path."""
    for entry in target.iterdir():
        entry.rename(slot / entry.name)
    target.rmdir()
    slot.rename(target)
