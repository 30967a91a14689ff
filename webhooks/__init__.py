"""Signed lifecycle webhooks. The contract is `docs/webhooks.md`; the rooms:

- `webhooks.sdk`: the consumer SDK a webhook consumer's author imports (standard library and PyJWT
  only), and the reference consumer behind `forgehand hooks serve` (`webhooks.cli`);
- `webhooks.core`: what the server side shares (tables, configuration, API shapes, the request
  body and its signature, outbound HTTP, metrics);
- `webhooks.policy`: synchronous policy calls before a guarded action (the API `tasks` calls);
- `webhooks.delivery`: notifications, the durable outbox and its deliverer;
- `webhooks.service`: endpoint management (create, change, rotate, ping, the log, redeliver);
- `webhooks.http`: the REST API and the web pages;
- `webhooks.wiring`: composition.

Composition (done by `forge/app/factory.py` and the `forgehand worker` command)::

    runtime = webhooks.wiring.wire(bus, settings, db)  # subscribes the outbox writer to the bus
    app.state.webhooks = runtime                        # routes and pages find it there
    await runtime.start()  /  await runtime.stop()      # the delivery loop (lifespan, worker)
    route_handlers += webhooks.http.ROUTE_HANDLERS

This module imports nothing, so that `webhooks.sdk` works with only PyJWT and the standard library
installed.
"""
