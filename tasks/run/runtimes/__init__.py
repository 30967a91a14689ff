"""The agent runtimes, one module each behind `base.Runtime`. A new runtime is one module here plus
one entry in `RUNTIMES` (the name a task's `runtime` field selects)."""

from collections.abc import Callable

from tasks.run.runtimes.acp.runtime import AcpRuntime
from tasks.run.runtimes.base import Runtime
from tasks.run.runtimes.builtin.runtime import BuiltinRuntime
from tasks.run.runtimes.claude.runtime import ClaudeCodeRuntime
from tasks.run.runtimes.codex.runtime import CodexRuntime
from tasks.run.runtimes.command.runtime import CommandRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "builtin": BuiltinRuntime,
    "command": CommandRuntime,
    "claude-code": ClaudeCodeRuntime,
    "codex": CodexRuntime,
    "acp": AcpRuntime,
}


def default_runtimes() -> dict[str, Runtime]:
    return {name: make() for name, make in RUNTIMES.items()}
