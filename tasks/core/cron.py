"""Cron expressions and time zones of schedules (pure): five fields (minute, hour, day of month,
month, day of week, as cron writes them; `croniter` reads them), an IANA time zone (`zoneinfo`),
and the next slot strictly after a moment, computed in the zone (so `0 9 * * *` stays 09:00 local
across daylight saving time) and returned in UTC."""

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import (  # type: ignore[import-untyped]  # no stubs published
    CroniterBadCronError,
    CroniterBadDateError,
    CroniterError,
    croniter,
)

from forge.core.errors import InvalidInput


def check_cron(expr: str) -> str:
    """The expression, normalized to single spaces; `invalid_cron` (422) with the reason otherwise."""
    fields = expr.split()
    if len(fields) != 5:
        raise InvalidInput(
            f"a cron expression has 5 fields (minute hour day-of-month month day-of-week), not {len(fields)}",
            code="invalid_cron",
            field="cron",
        )
    normalized = " ".join(fields)
    try:
        croniter(normalized, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except (CroniterBadCronError, CroniterBadDateError, CroniterError, ValueError, KeyError) as exc:
        raise InvalidInput(
            f"{normalized!r} is not a cron expression: {exc}", code="invalid_cron", field="cron"
        ) from None
    return normalized


def check_timezone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (e.g. `Europe/Berlin`, `UTC`); `unknown_timezone` (422) otherwise."""
    if not name or len(name) > 64 or name.startswith(("/", ".")) or ".." in name or "\x00" in name:
        raise InvalidInput(f"{name[:64]!r} is not an IANA time zone", code="unknown_timezone", field="timezone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidInput(
            f"{name!r} is not an IANA time zone (e.g. UTC, Europe/Berlin)", code="unknown_timezone", field="timezone"
        ) from None


def next_slot(expr: str, zone: str, after: datetime) -> datetime:
    """The first time of `expr` in `zone` strictly after `after`, in UTC."""
    local = after.astimezone(ZoneInfo(zone))
    found: datetime = croniter(expr, local).get_next(datetime)
    return found.astimezone(UTC)
