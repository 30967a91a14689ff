"""Settings: one msgspec struct loaded from `FORGEHAND_*` variables and an optional TOML file.

Precedence: environment variable > TOML file (`FORGEHAND_CONFIG`) > default. Every error names the
variable (or the file key) it came from, so an operator knows what to fix.
"""

import hashlib
import os
import secrets
import tempfile
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from forge.core.addresses import AllowList
from forge.core.worker_labels import parse_labels

ENV_PREFIX = "FORGEHAND_"
# Variables of other forgehand programs, not settings of the instance: skipped, never "unknown".
# FORGEHAND_HOOKS_SECRET: the endpoint secret of the reference consumer (`forgehand hooks serve`).
NOT_SETTINGS = frozenset({"FORGEHAND_HOOKS_SECRET"})


class SettingsError(ValueError):
    """A setting is missing or invalid; the message names the variable."""


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    host: str = "127.0.0.1"
    port: int = 8000
    # Made absolute once, when the settings are loaded (relative to the directory the command was
    # started in): git hooks run inside each bare repository and must find the same directory.
    data_dir: Path = Path("./var")
    # Empty means SQLite at <data_dir>/forgehand.db.
    database_url: str = ""
    # Empty means http://<host>:<port>; the public URL used in links and webhook payloads.
    base_url: str = ""
    # Empty means generated into <data_dir>/secret_key on first start.
    secret_key: str = ""
    # Stable identity of this instance (JWT `iss` of webhooks); generated into the data dir when empty.
    instance_id: str = ""
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # Largest API/form request body; git pushes have their own limit.
    max_body_bytes: int = 1024 * 1024
    max_push_bytes: int = 2 * 1024 * 1024 * 1024
    session_days: int = 14
    # Failed sign-ins allowed per login (and, 4x that, per client address) inside the window.
    signin_max_failures: int = 5
    signin_window_seconds: int = 900
    # Seconds a validated token stays cached in-process (revocation through this process is immediate).
    token_cache_seconds: float = 5.0
    # Task worker and webhook deliverer inside `serve` (`forgehand worker` runs both on its own).
    run_worker: bool = True
    # Hosts webhook URLs may use over http or at non-global addresses (comma-separated; e.g.
    # "127.0.0.1,localhost" for local consumers). Everything else must be https and public.
    webhooks_allowed_hosts: str = ""
    webhooks_policy_concurrency: int = 32
    # Seconds one policy dispatch may take in all (every endpoint, retry and wait): past it the
    # failure policy decides. Up to 10; raise it for consumers that act before they answer.
    webhooks_policy_deadline_seconds: float = 5.0
    webhooks_delivery_concurrency: int = 8
    # Deliver notifications from this process (with run_worker); false leaves it to `forgehand worker`.
    webhooks_deliver: bool = True
    seed_demo: bool = True
    # Tasks: the sandbox image ("" = the built-in recipe's tag), concurrency, watchdogs, model endpoint.
    sandbox_image: str = ""
    task_concurrency: int = 2
    task_repo_concurrency: int = 1
    # This process's worker: the labels it offers (comma-separated, e.g. "gpu,large"; a run whose
    # task requires labels goes only to a worker with all of them) and how many runs it takes at
    # once (0: task_concurrency). `forgehand worker --labels/--capacity` set them too.
    worker_labels: str = ""
    worker_capacity: int = 0
    # A worker's lease on its runs: renewed every second; once this many seconds pass without a
    # renewal (its process killed, its host off, its network cut), another worker takes the runs
    # over (docs/operator.md). Between 3 and 600.
    worker_lease_seconds: float = 30.0
    task_turn_limit: int = 50
    task_tool_timeout_seconds: float = 600.0
    task_idle_seconds: float = 900.0
    task_wall_clock_seconds: int = 3600
    task_token_budget: int = 0  # 0 = no budget
    task_max_file_bytes: int = 10 * 1024 * 1024
    # Each run's workspace is its own filesystem of this size ("mount", needs root); "watchdog" is the
    # fallback without root, which ends the run at the limit but cannot stop a fast writer before it.
    task_workspace_limit_mb: int = 1024
    # Environments (docs/environments.md): what one setup may write into its image, and the disk
    # all of this instance's environment images may take on an engine (the oldest go first).
    environment_disk_limit_mb: int = 4096
    environment_images_limit_mb: int = 20480
    # Local images (comma-separated references, never pulled) an environment may start from besides
    # the built-in ones: a toolchain the built-in images lack (the builtin and command runtimes).
    environment_extra_images: str = ""
    task_workspace_quota: Literal["mount", "watchdog"] = "mount"
    # Sandboxes kept started ahead, per image, each handed to one run (docs/operator.md); 0 = off.
    task_sandbox_pool: int = 0
    # A tool call parked for a person (policy `ask` or failure policy `hold`) expires after this.
    task_approval_ttl_seconds: int = 1800
    model_base_url: str = ""
    model_name: str = ""
    model_api_key: str = ""
    model_timeout_seconds: float = 120.0
    # The instance's Anthropic provider (Claude Code runtimes); the gateway injects the key on the host.
    anthropic_base_url: str = "https://api.anthropic.com"
    anthropic_api_key: str = ""
    anthropic_model: str = ""
    # Hosts that model endpoints chosen by repository admins or in personal keys may use at
    # non-global addresses (loopback, private, link-local; names, addresses or CIDRs, comma-separated,
    # as webhooks_allowed_hosts). The instance's own model_base_url and anthropic_base_url are trusted.
    model_allowed_hosts: str = ""
    # The provider may search the web for a run's agent (OpenAI Responses' hosted web_search tool);
    # a repository's task settings override it. Off: such requests are refused by the gateway.
    task_allow_web_search: bool = False
    # Optional price table for the model gateway's cost metering: a JSON or TOML file of
    # {model: {input, output, cache_read, cache_write}} in USD per million tokens.
    model_prices: str = ""
    # Egress (docs/egress.md): what the proxy may connect to although the address rules refuse it
    # (comma-separated host[:port], addresses or CIDRs, like webhooks_allowed_hosts), and the
    # presets (pypi, npm, debian) every repository that allows egress gets. Checked at start.
    egress_allowed_hosts: str = ""
    egress_presets: str = ""
    # The root of the per-run socket directories (the model gateway, the hook bridge, egress), each
    # instance's in a directory of its own below it; short: socket paths have a 107-byte limit.
    # Empty means <tempdir>/forgehand-runs, shared by every instance on the host.
    run_channel_dir: str = ""
    # Hook and back-channel calls a run's sandbox may make on its channel: calls a second sustained,
    # at once above that, and in the whole run; past them it gets 429 (docs/operator.md).
    run_channel_call_rate: float = 10.0
    run_channel_call_burst: int = 100
    run_channel_call_cap: int = 20_000
    # ACP agents an operator configures for the `acp` runtime: a TOML or JSON file of
    # {agents: [{name, command, image, description, provider, layers}]} (docs/agents.md).
    acp_agents: str = ""
    # E-mail of notifications (docs/notifications.md): the SMTP server ("" = no e-mail), its port,
    # the login (optional), the From address, STARTTLS (on unless the port is 465: implicit TLS)
    # and the seconds any one SMTP step may take.
    smtp_host: str = ""
    smtp_port: int = 587
    smtp_user: str = ""
    smtp_password: str = ""
    smtp_from: str = ""
    smtp_starttls: bool = True
    smtp_timeout_seconds: float = 30.0

    @property
    def effective_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{(self.data_dir / 'forgehand.db').resolve()}"

    @property
    def effective_base_url(self) -> str:
        return (self.base_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def run_channel_root(self) -> Path:
        """The directory every instance on the host keeps its run channels under (by default)."""
        return Path(self.run_channel_dir or Path(tempfile.gettempdir()) / "forgehand-runs")

    @property
    def effective_run_channel_dir(self) -> Path:
        """This instance's run channels: a directory of its own under the root, named after the
        instance id (hashed: short, and safe whatever the id holds), so that one instance's sweep
        never reaches another's runs."""
        instance = (self.instance_id or "forgehand").encode()
        return self.run_channel_root / ("i" + hashlib.sha256(instance).hexdigest()[:10])

    @property
    def worker_label_set(self) -> frozenset[str]:
        """The labels this process's worker offers."""
        return frozenset(parse_labels(self.worker_labels))

    @property
    def effective_worker_capacity(self) -> int:
        """How many runs this process's worker runs at once."""
        return self.worker_capacity or self.task_concurrency

    @property
    def is_sqlite(self) -> bool:
        return self.effective_database_url.startswith("sqlite")

    @property
    def secure_cookies(self) -> bool:
        return self.effective_base_url.startswith("https://")


_FIELDS = {f.name: f for f in msgspec.structs.fields(Settings)}


def _env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def _coerce(name: str, source: str, raw: Any) -> Any:
    field = _FIELDS[name]
    if isinstance(raw, str) and field.type is bool:
        lowered = raw.strip().lower()
        if lowered in {"1", "true", "yes", "on"}:
            return True
        if lowered in {"0", "false", "no", "off"}:
            return False
        raise SettingsError(f"{source}: expected a boolean (true/false), got {raw!r}")
    if field.type is Path:
        if not isinstance(raw, str) or not raw.strip():
            raise SettingsError(f"{source}: expected a directory path, got {raw!r}")
        return Path(raw)
    try:
        return msgspec.convert(raw, field.type, strict=False)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"{source}: {exc}, got {raw!r}") from None


# Settings that must be positive integers.
_POSITIVE = (
    "max_body_bytes",
    "max_push_bytes",
    "session_days",
    "signin_max_failures",
    "task_concurrency",
    "task_repo_concurrency",
    "task_turn_limit",
    "task_tool_timeout_seconds",
    "task_idle_seconds",
    "task_wall_clock_seconds",
    "task_max_file_bytes",
    "task_workspace_limit_mb",
    "environment_disk_limit_mb",
    "environment_images_limit_mb",
    "task_approval_ttl_seconds",
    "model_timeout_seconds",
    "webhooks_policy_concurrency",
    "webhooks_delivery_concurrency",
    "run_channel_call_rate",
    "run_channel_call_burst",
    "run_channel_call_cap",
)


def _validate(s: Settings, sources: Mapping[str, str]) -> None:
    def src(name: str) -> str:
        return sources.get(name, _env_name(name))

    if not 1 <= s.port <= 65535:
        raise SettingsError(f"{src('port')}: expected a port between 1 and 65535, got {s.port}")
    if s.base_url:
        parts = urlsplit(s.base_url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise SettingsError(f"{src('base_url')}: expected an http(s) URL, got {s.base_url!r}")
        if parts.query or parts.fragment or parts.username:
            raise SettingsError(f"{src('base_url')}: must not carry a query, fragment or userinfo")
    if s.anthropic_base_url:
        parts = urlsplit(s.anthropic_base_url)
        if parts.scheme not in {"http", "https"} or not parts.hostname:
            raise SettingsError(f"{src('anthropic_base_url')}: expected an http(s) URL, got {s.anthropic_base_url!r}")
    if s.run_channel_dir and (not Path(s.run_channel_dir).is_absolute() or len(s.run_channel_dir) > 60):
        raise SettingsError(
            f"{src('run_channel_dir')}: expected an absolute path of at most 60 characters "
            "(Unix socket paths are limited to 107 bytes)"
        )
    if s.database_url and not s.database_url.startswith(("sqlite+aiosqlite://", "postgresql+asyncpg://")):
        raise SettingsError(
            f"{src('database_url')}: expected sqlite+aiosqlite:///PATH or postgresql+asyncpg://..., "
            f"got {s.database_url.split('://')[0]!r} scheme"
        )
    for name in ("model_allowed_hosts", "webhooks_allowed_hosts"):
        try:
            AllowList.parse(getattr(s, name), setting=src(name))
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
    try:
        parse_labels(s.worker_labels)
    except ValueError as exc:
        raise SettingsError(f"{src('worker_labels')}: {exc}") from None
    if s.worker_capacity < 0:
        raise SettingsError(f"{src('worker_capacity')}: must not be negative (0: task_concurrency)")
    if not 3 <= s.worker_lease_seconds <= 600:
        raise SettingsError(f"{src('worker_lease_seconds')}: expected seconds between 3 and 600")
    if s.secret_key and len(s.secret_key) < 32:
        raise SettingsError(f"{src('secret_key')}: must be at least 32 characters")
    for name in _POSITIVE:
        if getattr(s, name) <= 0:
            raise SettingsError(f"{src(name)}: must be a positive integer")
    if not 0.1 <= s.webhooks_policy_deadline_seconds <= 10:
        raise SettingsError(f"{src('webhooks_policy_deadline_seconds')}: expected seconds between 0.1 and 10")
    if s.task_workspace_quota == "mount" and s.task_workspace_limit_mb < 16:
        raise SettingsError(f"{src('task_workspace_limit_mb')}: must be at least 16 (MiB) for a mounted workspace")
    if not 0 <= s.task_sandbox_pool <= 32:
        raise SettingsError(f"{src('task_sandbox_pool')}: must be between 0 (off) and 32")
    _validate_smtp(s, src)
    for name in ("token_cache_seconds", "task_token_budget"):
        if getattr(s, name) < 0:
            raise SettingsError(f"{src(name)}: must not be negative (0 turns it off)")


def _validate_smtp(s: Settings, src: Any) -> None:
    if not 1 <= s.smtp_port <= 65535:
        raise SettingsError(f"{src('smtp_port')}: expected a port between 1 and 65535, got {s.smtp_port}")
    if s.smtp_host and "@" not in s.smtp_from:
        raise SettingsError(f"{src('smtp_from')}: e-mail needs a From address (forgehand@example.org) with smtp_host")
    if not 0 < s.smtp_timeout_seconds <= 300:
        raise SettingsError(f"{src('smtp_timeout_seconds')}: expected seconds between 0 and 300")


def load_settings(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build settings from a TOML file (optional), the environment, then explicit overrides."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}

    config_path = env.get(ENV_PREFIX + "CONFIG")
    if config_path:
        try:
            data = tomllib.loads(Path(config_path).read_text(encoding="utf-8"))
        except OSError as exc:
            raise SettingsError(f"FORGEHAND_CONFIG: cannot read {config_path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"FORGEHAND_CONFIG: {config_path} is not valid TOML: {exc}") from None
        for key, raw in data.items():
            if key not in _FIELDS:
                raise SettingsError(f"{config_path}: unknown setting {key!r}")
            source = f"{config_path}: {key}"
            values[key] = _coerce(key, source, raw)
            sources[key] = source

    known_env = {_env_name(n) for n in _FIELDS} | {ENV_PREFIX + "CONFIG"}
    for var, raw in env.items():
        if not var.startswith(ENV_PREFIX) or var.startswith(ENV_PREFIX + "TEST_") or var in NOT_SETTINGS:
            continue
        if var not in known_env:
            raise SettingsError(f"{var}: unknown setting (known: {', '.join(sorted(known_env))})")
        name = var[len(ENV_PREFIX) :].lower()
        if name == "config":
            continue
        values[name] = _coerce(name, var, raw)
        sources[name] = var

    for name, value in overrides.items():
        if name not in _FIELDS:
            raise SettingsError(f"unknown setting {name!r}")
        values[name] = value
        sources[name] = f"--{name.replace('_', '-')}"

    values["data_dir"] = absolute_data_dir(values.get("data_dir", _FIELDS["data_dir"].default))
    settings = Settings(**values)
    _validate(settings, sources)
    return settings


def absolute_data_dir(path: Path) -> Path:
    """The data directory as an absolute path, resolved against the current directory now (at
    start): every process the server starts (git and its hooks run in the bare repository) and
    every later use sees the same directory, whatever its own working directory."""
    return Path(path).expanduser().resolve()


def _read_or_create(path: Path, make: Any) -> str:
    """Read a generated value from the data dir, creating it (0600) on first start."""
    try:
        return path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        value: str = make()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(value + "\n")
        return value


def prepare_data_dir(settings: Settings) -> Settings:
    """Create the data directory and fill generated settings (secret key, instance id)."""
    data_dir = absolute_data_dir(settings.data_dir)
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        (data_dir / "repos").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise SettingsError(f"FORGEHAND_DATA_DIR: cannot create {data_dir}: {exc.strerror}") from None
    secret = settings.secret_key or _read_or_create(data_dir / "secret_key", lambda: secrets.token_urlsafe(48))
    instance = settings.instance_id or _read_or_create(data_dir / "instance_id", lambda: "fh-" + secrets.token_hex(8))
    return msgspec.structs.replace(settings, data_dir=data_dir, secret_key=secret, instance_id=instance)
