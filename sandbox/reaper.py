"""Finding and removing sandboxes by their labels, so a crash never leaves one running.

Which containers `reap(engine, instance, keep)` removes (docs/operator.md, "Sandboxes after a crash"):

1. Its own instance's sandboxes (`forgehand.instance`) whose run is not in `keep` (the caller's live
   runs), except the idle containers of a `SandboxPool` still alive (here or in another process).
2. Any instance's sandboxes whose creating process is provably gone (`owner.creator_gone`): the
   `forgehand.host` label is this host's name and either the kernel has rebooted since (another
   boot id) or, in the same pid namespace, that pid no longer runs the process that created it.

Nothing else: a sandbox of another instance whose creator is alive, on another host, in another
pid namespace, or without creator labels is never touched.
"""

import asyncio
from collections.abc import Collection

import docker
import docker.errors
import msgspec

from .engine import SandboxEngine
from .owner import LABEL_HOST, LABEL_OWNER, creator_gone
from .pool import idle_pool_kept, pool_identity
from .spec import LABEL_INSTANCE, LABEL_RUN, LABEL_TASK, LABEL_WEAKENED


class SandboxInfo(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    name: str
    image: str
    status: str  # Docker's state: running, exited, created...
    instance: str
    task: str
    run: str
    created: int  # unix seconds
    weakened: str = ""  # the label listing loosened defaults, empty when fully hardened
    host: str = ""  # the creating process's host and identity (owner.py); empty on older containers
    owner: str = ""
    orphaned: bool = False  # its creator is provably gone (owner.creator_gone)


async def list_sandboxes(engine: SandboxEngine, instance: str | None = None) -> list[SandboxInfo]:
    """Every container carrying forgehand labels (of one instance, or of all), running or not."""
    label = LABEL_INSTANCE if instance is None else f"{LABEL_INSTANCE}={instance}"

    def query(c: docker.DockerClient) -> list[dict[str, object]]:
        return list(c.api.containers(all=True, filters={"label": label}))

    rows = await engine.call(query)
    out = []
    for row in rows:
        labels = row.get("Labels") or {}
        assert isinstance(labels, dict)
        names = row.get("Names") or []
        assert isinstance(names, list)
        name = str(names[0]).lstrip("/") if names else ""
        task, run = str(labels.get(LABEL_TASK, "")), str(labels.get(LABEL_RUN, ""))
        pooled = pool_identity(labels, name)
        if pooled is not None:  # a pooled container's task and run are in its name once handed out
            task, run = pooled
        out.append(
            SandboxInfo(
                id=str(row["Id"]),
                name=name,
                image=str(row.get("Image", "")),
                status=str(row.get("State", "")),
                instance=str(labels.get(LABEL_INSTANCE, "")),
                task=task,
                run=run,
                created=int(str(row.get("Created", 0))),
                weakened=str(labels.get(LABEL_WEAKENED, "")),
                host=str(labels.get(LABEL_HOST, "")),
                owner=str(labels.get(LABEL_OWNER, "")),
                orphaned=creator_gone({str(k): str(v) for k, v in labels.items()}),
            )
        )
    return sorted(out, key=lambda s: (s.created, s.name))


async def reap(
    engine: SandboxEngine,
    instance: str,
    keep: Collection[str] = frozenset(),
    *,
    orphans: bool = True,
) -> list[SandboxInfo]:
    """Remove (kill first if needed) every sandbox of `instance` whose run id is not in `keep`, and,
    with `orphans`, every sandbox whose creating process is provably gone (the module doc).

    Idle containers of a `SandboxPool` still alive (in this process or another on this host) are kept too.

    Returns the sandboxes removed. Containers already gone by the time we get to them are skipped.
    """
    if not instance:
        raise ValueError("reap needs an instance id; it never removes other instances' sandboxes")
    doomed = [
        s
        for s in await list_sandboxes(engine, None if orphans else instance)
        if (s.instance == instance and s.run not in keep and not idle_pool_kept(s.run, s.host, s.orphaned))
        or s.orphaned
    ]

    async def remove(info: SandboxInfo) -> bool:
        def call(c: docker.DockerClient) -> bool:
            try:
                c.api.remove_container(info.id, force=True, v=True)
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # removal already in progress elsewhere
                    return False
                raise
            return True

        return await engine.call(call)

    done = await asyncio.gather(*(remove(info) for info in doomed))
    return [info for info, ok in zip(doomed, done, strict=True) if ok]
