"""Prometheus metrics of the webhooks package (served by the host at `/metrics`)."""

from prometheus_client import Counter, Gauge, Histogram

DISPATCHES = Counter(
    "forgehand_webhook_dispatches_total", "Policy calls, per endpoint, by event and result class", ["event", "result"]
)
DISPATCH_SECONDS = Histogram(
    "forgehand_webhook_dispatch_seconds",
    "Whole policy dispatches (all endpoints), by event",
    ["event"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DELIVERIES = Counter(
    "forgehand_webhook_deliveries_total", "Notification attempts, by event and result class", ["event", "result"]
)
DELIVERY_SECONDS = Histogram(
    "forgehand_webhook_delivery_seconds",
    "Notification attempts, by event",
    ["event"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 15),
)
OUTBOX_DEPTH = Gauge("forgehand_webhook_outbox_depth", "Notifications not yet delivered")
OUTBOX_OLDEST = Gauge("forgehand_webhook_outbox_oldest_seconds", "Age of the oldest undelivered notification")
CAUGHT_UP = Counter(
    "forgehand_webhook_caught_up_total", "Waiting notifications made due at once by their endpoint's recovery"
)
