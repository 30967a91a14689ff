"""Signed lifecycle webhooks: endpoints, signing, policy dispatch, the notification outbox, the URL
guard and the delivery log; plus the consumer SDK (`webhooks.consumer`) and the reference
consumer (`forgehand hooks serve`). The contract is `docs/webhooks.md`.

Composition (done by `forge/app/factory.py` and the `forgehand worker` command)::

    runtime = webhooks.wire(bus, settings, db)     # subscribes the outbox writer to the bus
    app.state.webhooks = runtime                    # routes and pages find it there
    await runtime.start()  /  await runtime.stop()  # the delivery loop (lifespan, worker)
    route_handlers += webhooks.ROUTE_HANDLERS

Policy API (what `tasks` calls before a guarded action)::

    outcome = await runtime.policy.dispatch(
        session_or_db,              # AsyncSession: endpoints are read and the delivery-log rows are
                                    #   added in the caller's transaction (they vanish if it rolls
                                    #   back); Database or None: a read session, then a write session
                                    #   of its own after the calls (don't hold a SQLite write lock then)
        "pre_tool_use",             # one of webhooks.POLICY_EVENTS
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

Everything but `consumer` and `protocol` is imported lazily, so that the consumer SDK works with
only PyJWT and the standard library installed.
"""

from typing import TYPE_CHECKING, Any

from webhooks.protocol import NOTIFY_EVENTS, POLICY_EVENTS

if TYPE_CHECKING:
    from webhooks.decoding import PolicyAnswer
    from webhooks.envelope import RepoRef, TaskMeta
    from webhooks.policy import PolicyDispatcher, PolicyOutcome
    from webhooks.policy_call import EndpointResult
    from webhooks.runtime import WebhooksRuntime, wire

__all__ = [
    "NOTIFY_EVENTS",
    "POLICY_EVENTS",
    "ROUTE_HANDLERS",
    "EndpointResult",
    "PolicyAnswer",
    "PolicyDispatcher",
    "PolicyOutcome",
    "RepoRef",
    "TaskMeta",
    "WebhooksRuntime",
    "wire",
]

_LAZY = {
    "wire": "webhooks.runtime",
    "WebhooksRuntime": "webhooks.runtime",
    "PolicyDispatcher": "webhooks.policy",
    "PolicyOutcome": "webhooks.policy",
    "EndpointResult": "webhooks.policy_call",
    "PolicyAnswer": "webhooks.decoding",
    "RepoRef": "webhooks.envelope",
    "TaskMeta": "webhooks.envelope",
}


def __getattr__(name: str) -> Any:
    import importlib

    if name == "ROUTE_HANDLERS":
        from webhooks.pages import InstanceHookPages, RepoHookPages
        from webhooks.routes import InstanceHooksController, RepoHooksController

        return [InstanceHooksController, RepoHooksController, InstanceHookPages, RepoHookPages]
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'webhooks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
