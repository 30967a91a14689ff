"""A run that changes nothing: no commit, no task branch created or moved, the run and the task say
"no changes", and the merge service refuses the empty diff with its own code."""

from collections.abc import Iterator

import pygit2
import pytest

from forge.core.settings import Settings
from tests.support.tasks import Env, serve_env, start, tree_files, wait_state, wait_task

pytestmark = pytest.mark.docker

TASK = "/api/v1/repos/ana/demo/tasks/1"
# Nothing the first time; a file when a message asks for one ($FORGEHAND_PROMPT is the message).
SCRIPT = 'if [ "$FORGEHAND_PROMPT" = "write it" ]; then echo hi > made.txt; fi; echo ran'


@pytest.fixture
def env(settings: Settings, sandbox_image: str) -> Iterator[Env]:
    yield from serve_env(settings)


async def test_a_run_that_changes_nothing_leaves_no_branch_and_cannot_be_merged(env: Env) -> None:
    async with env.client() as c:
        await start(c, SCRIPT)
        done = await wait_state(c, 1, "awaiting_review", "failed")
        assert done["state"] == "awaiting_review", done
        assert done["no_changes"] and done["head_sha"] == done["base_sha"]
        assert done["runs"][0]["no_changes"] and done["runs"][0]["end_sha"] == done["base_sha"]
        repo = pygit2.Repository(str(env.repo_path))
        assert repo.references.get(f"refs/heads/{done['branch']}") is None  # no empty task branch

        status = (await c.get(f"{TASK}/review-status")).json()
        assert "the task's runs changed nothing: there is nothing to merge" in status["blockers"]
        r = await c.post(f"{TASK}/merge", json={"strategy": "merge"})
        assert r.status_code == 409 and r.json()["code"] == "task_no_changes", r.text

        # The next run that does change something makes the branch, and the task has changes.
        r = await c.post(f"{TASK}/messages", json={"body": "write it"})
        assert r.status_code in (200, 201, 202), r.text
        again = await wait_task(
            c,
            1,
            lambda t: len(t["runs"]) == 2 and t["runs"][1]["finished_at"] and t["state"] == "awaiting_review",
            what="the message's run to end in review",
        )
        assert not again["no_changes"] and not again["runs"][1]["no_changes"], again
        ref = repo.references.get(f"refs/heads/{again['branch']}")
        assert ref is not None and str(ref.target) == again["head_sha"]
        assert tree_files(env.repo_path, again["head_sha"])["made.txt"][1] == b"hi\n"
