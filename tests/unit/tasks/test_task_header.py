"""The task page's usage line: what the gateway metered (tokens, cache, cost when priced), else the
runtime's own counters, else that no model was called."""

from datetime import UTC, datetime

import msgspec

from tasks.core.schemas import TaskRead, UsageRead
from tasks.http.pages.common import usage_line

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def task(**changes: object) -> TaskRead:
    base = {
        "number": 1, "repository": "ana/app", "title": "t", "goal": "g", "state": "running", "runtime": "builtin",
        "command": None, "agent": "fixer", "started_by": "ana", "base": "main", "branch": "forgehand/task-1",
        "base_sha": "a" * 40, "head_sha": "", "head_is_wip": False, "summary": "", "error": "",
        "failure_reason": None, "question": "", "queued_message": "", "queue_position": None,
        "html_url": "http://x/ana/app/tasks/1", "created_at": NOW, "updated_at": NOW, "runs": [],
    }  # fmt: skip
    return msgspec.structs.replace(TaskRead(**base), **changes)  # type: ignore[arg-type]


def test_no_model_calls_yet() -> None:
    assert usage_line(task()) == "no model calls yet"
    assert usage_line(task(state="merged")) == "no model calls"  # no "yet" once the task rests


def test_a_command_task_says_nothing_of_models() -> None:
    """The command runtime never calls a model: no usage line, whatever its state."""
    assert usage_line(task(runtime="command", command="make", state="running")) == ""
    assert usage_line(task(runtime="command", command="make", state="merged")) == ""


def test_metered_usage_with_cache_and_cost() -> None:
    usage = UsageRead(
        input_tokens=12_345, output_tokens=678, cache_read_tokens=9, cache_write_tokens=1, cost_usd=0.0421
    )
    assert usage_line(task(usage=usage)) == ("12,345 input + 678 output tokens (cache: 9 read, 1 written) · $0.0421")


def test_unpriced_usage_says_so() -> None:
    line = usage_line(task(usage=UsageRead(input_tokens=10, output_tokens=5)))
    assert line == "10 input + 5 output tokens · cost not known"
