"""What forgehand sets in Codex's configuration, one list for both ways Codex runs here: `codex
exec` (the codex runtime passes each setting as a `-c key=value` override) and `codex app-server`
under the codex-acp adapter (the ACP runtime writes the same settings to `$CODEX_HOME/config.toml`
after clearing what an earlier run left there, and hands them to the adapter as its session
config, which outranks a repository's `.codex/config.toml`).

The settings: the model provider is the run's gateway through the sandbox's relay (Codex needs a
TCP base URL), Responses API, the run token as the bearer (read from `FORGEHAND_RUN_TOKEN`, not a
provider key); what would reach out on its own is off (plugins, analytics, provider-side web search
unless the repository allows it, a `notify` program after each turn); no TTY for `write_stdin`
(which no hook sees); forgehand's back-channel as the one MCP server."""

import json
from typing import Any

from sandbox import SandboxError
from sandbox.spec import GATEWAY_RELAY_PORT, HOME_DIR
from tasks.run.runtimes.base import RunContext

PROVIDER = "forgehand"
TOKEN_ENV = "FORGEHAND_RUN_TOKEN"
RELAY = f"http://127.0.0.1:{GATEWAY_RELAY_PORT}"


def provider_fields(base_url: str) -> dict[str, str]:
    return {"name": PROVIDER, "base_url": base_url, "env_key": TOKEN_ENV, "wire_api": "responses"}


def codex_settings(*, allow_web_search: bool) -> list[tuple[str, Any]]:
    """(dotted key, value) pairs, in the order the command line gives them."""
    settings: list[tuple[str, Any]] = [
        ("model_provider", PROVIDER),
        (f"model_providers.{PROVIDER}", provider_fields(f"{RELAY}/v1")),
        ("features.plugins", False),  # marketplaces
        ("analytics.enabled", False),
        ("notify", []),  # a user config's `notify` would be a program run outside any hook
        ("features.unified_exec_tty", False),
        # The image's requirements allow no other MCP server; a gateway without /mcp only costs a
        # line on stderr.
        ("mcp_servers.forgehand", {"url": f"{RELAY}/mcp", "bearer_token_env_var": TOKEN_ENV}),
    ]
    if not allow_web_search:  # the repository's setting
        settings.append(("web_search", "disabled"))
    return settings


def toml_value(value: Any) -> str:
    """A TOML value (strings as JSON strings, which TOML's basic strings read the same)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}={toml_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {type(value).__name__}")


def overrides(settings: list[tuple[str, Any]]) -> list[str]:
    """The `-c` arguments of `codex exec`."""
    out: list[str] = []
    for key, value in settings:
        out += ["-c", f"{key}={toml_value(value)}"]
    return out


def config_toml(settings: list[tuple[str, Any]], *, model: str = "") -> str:
    """`$CODEX_HOME/config.toml` with the same settings (dotted keys at the top level)."""
    lines = [f"model = {toml_value(model)}"] if model else []
    lines += [f"{key} = {toml_value(value)}" for key, value in settings]
    return "# written by forgehand before each start; anything else here is removed\n" + "\n".join(lines) + "\n"


def nested(settings: list[tuple[str, Any]], *, model: str = "") -> dict[str, Any]:
    """The settings as one JSON object (codex-acp's `CODEX_CONFIG`, its session config)."""
    out: dict[str, Any] = {"model": model} if model else {}
    for key, value in settings:
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


CONFIG_PATH = ".codex/config.toml"  # under $HOME; CODEX_HOME is $HOME/.codex


async def write_config(ctx: RunContext, text: str) -> None:
    """Write `$CODEX_HOME/config.toml` in the sandbox (after the scrub); a failure stops the run."""
    script = f'cd "$HOME" && mkdir -p .codex && cat > {CONFIG_PATH}'
    result = await ctx.sandbox.exec(["sh", "-c", script], stdin=text.encode(), timeout=60, env={"HOME": HOME_DIR})
    if not result.ok:
        tail = result.stderr.decode(errors="replace")[-300:]
        raise SandboxError(f"could not write Codex's configuration: {tail}")
