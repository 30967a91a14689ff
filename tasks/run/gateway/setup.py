"""Making a run's channel from what the run resolved (which key pays, per provider), and the
sweep of channel directories no live run owns (at worker start)."""

import shutil
import socket
import stat
import time
from collections.abc import Mapping
from pathlib import Path

from forge.core.settings import Settings
from forge.db.allowlists import AllowListSource
from forge.db.engine import Database
from tasks.core.repo_settings import Provider, ProviderAccess
from tasks.run.gateway.channel import ProviderInfo, RunChannel, channel_name
from tasks.run.gateway.endpoint import Upstream
from tasks.run.gateway.guard import allow_list
from tasks.run.gateway.limits import CallLimits
from tasks.run.gateway.metering import load_prices
from tasks.run.gateway.routes import Emit


class ChannelUnavailable(Exception):
    """The run needs a model and cannot have one (nothing configured, a bad price table)."""


def provider_of(runtime: object) -> Provider:
    """The provider a runtime speaks (`model_provider`); the CLI agents' default is Anthropic's."""
    return "openai" if getattr(runtime, "model_provider", "anthropic") == "openai" else "anthropic"


def build_channel(
    settings: Settings,
    access: Mapping[Provider, ProviderAccess],
    provider: Provider,
    *,
    task_id: int,
    run_id: int,
    run_uuid: str,
    emit: Emit,
    db: Database | None = None,
) -> RunChannel:
    """The channel of one run (not started): upstreams for every configured provider, the run's
    budget, the price table. `provider` is what the runtime speaks; its key source is the run's.
    With `db`, the guarded endpoints are checked against the model allow-list as it is at each
    connection (the operator's floor and an instance admin's hosts); without, the floor alone."""
    paying = access.get(provider)
    if paying is None or not paying.configured:
        raise ChannelUnavailable("no model endpoint is configured")
    try:
        prices = load_prices(settings.model_prices)
        floor = allow_list(settings.model_allowed_hosts)
    except ValueError as exc:
        raise ChannelUnavailable(str(exc)) from None
    allowed = AllowListSource(db, "model", floor) if db is not None else floor
    upstreams: dict[str, Upstream] = {
        name: Upstream(
            provider=name,
            base_url=a.base_url,
            api_key=a.api_key,
            model=a.model,
            timeout=settings.model_timeout_seconds,
            guarded=not a.trusted,
        )
        for name, a in access.items()
        # Only the provider this run's runtime speaks: a claude-code run must not be able to spend
        # the OpenAI key (recorded nowhere, as the paying key is the Anthropic one).
        if a.configured and name == provider
    }
    info = ProviderInfo(
        anthropic_model=access["anthropic"].model if "anthropic" in access else "",
        openai_model=access["openai"].model if "openai" in access else "",
        model_key=paying.source,
        provider=provider,
        allow_web_search=settings.task_allow_web_search,
    )
    return RunChannel(
        root=settings.effective_run_channel_dir,
        task_id=task_id,
        run_id=run_id,
        run_uuid=run_uuid,
        upstreams=upstreams,
        provider=info,
        token_budget=settings.task_token_budget,
        prices=prices,
        emit=emit,
        allowed_hosts=allowed,
        call_limits=call_limits(settings),
    )


def call_limits(settings: Settings) -> CallLimits:
    return CallLimits(
        rate=settings.run_channel_call_rate, burst=settings.run_channel_call_burst, cap=settings.run_channel_call_cap
    )


# A channel directory changed this recently is never swept: its run may be starting (the
# directory made, its sockets not yet served) on a worker this database does not know.
SWEEP_MIN_AGE_SECONDS = 600.0


def _serving(sock_path: Path) -> bool:
    """Someone still answers on the socket (another worker's, or another instance's, live run)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(sock_path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _in_use(entry: Path, now: float) -> bool:
    """A channel directory that may belong to a live run: changed in the last ten minutes, or
    with any socket in it someone still answers on (the gateway's, the egress proxy's, ...)."""
    try:
        info = entry.lstat()
        if now - info.st_mtime < SWEEP_MIN_AGE_SECONDS:  # an entry made or removed in it changes it
            return True
        sockets = [f for f in entry.iterdir() if stat.S_ISSOCK(f.lstat().st_mode)]
    except OSError:
        return True  # changing under us: someone is there
    return any(_serving(s) for s in sockets)


def sweep_channels(root: Path, live_run_uuids: set[str], *, now: float | None = None) -> list[Path]:
    """Remove the run channel directories in `root` (this instance's, FORGEHAND_RUN_CHANNEL_DIR
    keeps one per instance) of runs that are not live, that nobody serves any more and that did
    not change for ten minutes (a crashed worker's). A directory some process still serves is
    kept whatever this database says (another worker's run, another instance's). Blocking."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    now = time.time() if now is None else now
    keep = {channel_name(u) for u in live_run_uuids}
    for entry in root.iterdir():
        if not entry.is_dir() or entry.is_symlink() or entry.name in keep or len(entry.name) != 16:
            continue
        if _in_use(entry, now):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed
