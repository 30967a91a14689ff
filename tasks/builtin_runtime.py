"""The `builtin` runtime (placeholder until the agent loop lands)."""

from tasks.runtime import Outcome, RunContext, RuntimeUnavailable
from tasks.states import FailureReason


class BuiltinRuntime:
    name = "builtin"

    def needs_model(self) -> bool:
        return True

    async def run(self, ctx: RunContext) -> Outcome:
        raise RuntimeUnavailable("the builtin runtime is not available yet", FailureReason.MODEL_UNREACHABLE)
