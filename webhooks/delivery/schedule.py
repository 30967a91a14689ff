"""When a notification goes (again): the retry schedule, `Retry-After`, the timeouts of one
attempt, the lease of a claim, and how long finished rows and the delivery log are kept.

Schedule after the first attempt: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h, each
with up to +20 % jitter and never early; `Retry-After` is honoured within [base, 2 x base]. Then
the row is `failed`. `410 Gone` disables the endpoint; so does failing for 5 days (with a notice).
When a failing endpoint answers again, its waiting rows go at once (`webhooks.delivery.recovery`).
"""

import random
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime

RETRY_SCHEDULE: tuple[int, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
MAX_ATTEMPTS = 1 + len(RETRY_SCHEDULE)
AUTO_DISABLE_AFTER = timedelta(days=5)
CONNECT_TIMEOUT = 5.0
TOTAL_TIMEOUT = 15.0
LEASE = timedelta(seconds=60)
LEASE_MARGIN = timedelta(seconds=TOTAL_TIMEOUT + 5)  # lease left for an attempt to start
KEEP_FINISHED = timedelta(days=7)
KEEP_LOG = timedelta(days=30)


def retry_delay(attempts_done: int, retry_after: float | None, rng: random.Random) -> float | None:
    """Seconds until the next attempt after `attempts_done` failed ones; None when out of tries."""
    if attempts_done < 1 or attempts_done > len(RETRY_SCHEDULE):
        return None
    base = float(RETRY_SCHEDULE[attempts_done - 1])
    if retry_after is not None:
        return min(max(retry_after, base), 2 * base)
    return base * (1.0 + 0.2 * rng.random())


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())
