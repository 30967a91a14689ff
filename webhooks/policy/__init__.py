"""Policy hooks: synchronous calls to policy endpoints before a guarded action. This is the API
`tasks` calls (its webhook gate); the runtime built by `webhooks.wiring.wire` holds the dispatcher.

Policy API (what `tasks` calls before a guarded action)::

    outcome = await runtime.policy.dispatch(
        session_or_db,              # AsyncSession: endpoints are read and the delivery-log rows are
                                    #   added in the caller's transaction (they vanish if it rolls
                                    #   back); Database or None: a read session, then a write session
                                    #   of its own after the calls (don't hold a SQLite write lock then)
        "pre_tool_use",             # one of webhooks.sdk.protocol.POLICY_EVENTS
        repo=RepoRef.of(repository),            # id, uuid, "owner/name"
        task_meta=TaskMeta(task=TaskRef(...), run=RunRef(...), actor=AccountRef(...), agent=AccountRef(...)),
        data={"tool_use_id": ..., "tool_name": ..., "tool_input": {...}},
        deadline=5.0,               # seconds for the whole dispatch; default 5, clamped to 10
    )

`PolicyOutcome`: `decision` (`allow`/`deny`/`ask`), `reason` (of the deciding deny/ask),
`input_override` (None, or `{"prompt": str}` for user_prompt_submit / the new `tool_input`
object for pre_tool_use, after every override in order), `model_contexts` and `user_messages`
(lists in endpoint order; contexts for the model only, messages for people only), `results`
(one `EndpointResult` per endpoint called: `endpoint_id`, `url`, `result` class — ok, denied,
asked, http_error, protocol_error, timeout, connection_error, over_capacity —, `decision`,
`effective`, `failure_policy`, `reason`, `status`, `attempts`, `latency_ms`, `detail`,
`delivery_id`), `delivery_id` (the wid of the dispatch), `deciding` (the first deny, else the
first ask), `held` (the ask comes from `failure_policy=hold`), `failure` / `failure_message`
(`hook dispatch failed: <event>: <class> (delivery <id>)` when a failure decided: answer 502
`hook_dispatch_failed` on user_prompt_submit, fail the run on pre_tool_use). With no endpoint
the outcome is `allow` with empty lists. A failure of an endpoint with `failure_policy=closed`
counts as a deny on every event, including those without a permission (post_tool_use, stop):
the caller decides what a deny means there.

"""

from webhooks.core.envelope import RepoRef, TaskMeta
from webhooks.policy.answers import PolicyAnswer
from webhooks.policy.dispatcher import PolicyDispatcher, PolicyOutcome
from webhooks.policy.endpoint_call import EndpointResult

__all__ = ["EndpointResult", "PolicyAnswer", "PolicyDispatcher", "PolicyOutcome", "RepoRef", "TaskMeta"]
