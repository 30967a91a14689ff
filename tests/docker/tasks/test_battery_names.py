"""A file name that is not UTF-8, written by the agent (`touch $'bad\\xffname'`): the run settles,
the name is skipped with a notice that shows it escaped, and the workspace with its quota mount
goes. And a settle step that fails anyway ends its run `settle_failed`, never left `running`."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from forge.core.settings import Settings
from forge.git import snapshot as snapshot_module
from sandbox import quota_mounts
from tests.support.tasks import Env, all_events, containers_of, serve_env, start, tree_files, wait_state
from tests.support.waiting import until

pytestmark = [pytest.mark.docker, pytest.mark.both_databases]  # its point is what the database keeps

WRITES_A_BAD_NAME = "touch $'bad\\xffname' && mkdir $'dir\\xfe' && echo x > $'dir\\xfe/in' && echo ok > good.txt"


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(settings)


async def workspaces_left(env: Env, deadline: float = 60.0) -> list[Path]:
    """The workspaces (and quota mounts) still there once the settle step had `deadline` seconds
    to remove them (it does so after recording the run's end)."""
    root = env.settings.data_dir / "workspaces"
    left: list[Path] = []

    def none_left() -> bool:
        nonlocal left
        left = [*quota_mounts(root), *(p for p in root.rglob("*") if p.is_dir())] if root.exists() else []
        return not left

    await until(none_left, timeout=deadline, what="the settle step to remove the workspaces", show=lambda: left)
    return left


async def test_a_name_that_is_not_utf8_is_skipped_with_a_notice(env: Env) -> None:
    async with env.client() as c:
        await start(c, WRITES_A_BAD_NAME)
        done = await wait_state(c, 1, "awaiting_review", "failed", timeout=180)
        assert done["state"] == "awaiting_review", done
        run = done["runs"][0]
        assert run["state"] == "succeeded"
        skipped = {s["path"]: s["reason"] for s in run["skipped"]}
        assert skipped == {
            "bad\\xffname": "the file name is not valid UTF-8",
            "dir\\xfe": "the file name is not valid UTF-8",
        }
        assert set(tree_files(env.repo_path, done["head_sha"])) >= {"good.txt"}
        notices = [e["payload"]["text"] for e in await all_events(c, 1) if e["kind"] == "notice"]
        assert any("bad\\xffname (the file name is not valid UTF-8)" in n for n in notices), notices
    assert not containers_of(env.settings)
    assert await workspaces_left(env) == []


async def test_a_settle_that_fails_ends_the_run_failed(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the escaping (as before it), the snapshot's report cannot be encoded: the settle
    step raises, and the run still ends, failed with its reason, its workspace unmounted."""
    monkeypatch.setattr(snapshot_module, "shown", lambda path: path)
    async with env.client() as c:
        await start(c, WRITES_A_BAD_NAME)
        done = await wait_state(c, 1, "failed", "awaiting_review", timeout=180)
        assert done["state"] == "failed" and done["failure_reason"] == "settle_failed", done
        assert "could not be settled: UnicodeEncodeError" in done["error"]
        assert done["runs"][0]["state"] == "failed"
        # The snapshot landed before the report failed: the task records it (work in progress).
        assert "good.txt" in tree_files(env.repo_path, done["head_sha"])
        notices = [e["payload"]["text"] for e in await all_events(c, 1) if e["kind"] == "notice"]
        assert any("could not be settled" in n for n in notices), notices
    assert await workspaces_left(env) == []
