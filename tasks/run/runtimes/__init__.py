"""The agent runtimes, one module each behind `base.Runtime`. A new runtime is one module here plus
one entry in `RUNTIMES` (the name a task's `runtime` field selects)."""

from collections.abc import Callable

from tasks.run.runtimes.acp import AcpRuntime
from tasks.run.runtimes.base import Runtime
from tasks.run.runtimes.builtin import BuiltinRuntime
from tasks.run.runtimes.claude_code import ClaudeCodeRuntime
from tasks.run.runtimes.codex import CodexRuntime
from tasks.run.runtimes.command import CommandRuntime

RUNTIMES: dict[str, Callable[[], Runtime]] = {
    "builtin": BuiltinRuntime,
    "command": CommandRuntime,
    "claude-code": ClaudeCodeRuntime,
    "codex": CodexRuntime,
    "acp": AcpRuntime,
}


def default_runtimes() -> dict[str, Runtime]:
    return {name: make() for name, make in RUNTIMES.items()}
