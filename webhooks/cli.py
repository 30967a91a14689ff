"""`forgehand hooks ...`: the reference consumer."""

import os
import re
from pathlib import Path

import click

from webhooks.sdk.protocol import decode_secret

# The endpoint secret(s) of `forgehand hooks serve`, whitespace-separated (two during a rotation).
# forge.core.settings skips this variable: it is the consumer's, not a setting of the instance.
SECRET_ENV = "FORGEHAND_HOOKS_SECRET"


def _pattern(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}") from None
    return value


def _read_secret_file(path: Path) -> list[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(f"cannot read {path}: {exc}", param_hint="--secret-file") from None
    found = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not found:
        raise click.BadParameter(f"{path} holds no secret (one whsec_... per line)", param_hint="--secret-file")
    return found


def endpoint_secrets(files: tuple[Path, ...], on_argv: tuple[str, ...]) -> list[str]:
    """The secrets from --secret-file and --secret, else from FORGEHAND_HOOKS_SECRET; each checked."""
    found = [secret for path in files for secret in _read_secret_file(path)] + list(on_argv)
    source = "--secret-file/--secret"
    if not found:
        found, source = os.environ.get(SECRET_ENV, "").split(), SECRET_ENV
    if not found:
        raise click.UsageError(
            f"no endpoint secret: give --secret-file PATH (a file holding the whsec_... secret) or set {SECRET_ENV}"
        )
    for secret in found:
        try:
            decode_secret(secret)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint=source) from None
    return found


@click.group("hooks")
def hooks_group() -> None:
    """Webhook tools: the reference consumer."""


@hooks_group.command("serve")
@click.option("--audience", required=True, help="The endpoint URL exactly as configured in forgehand.")
@click.option(
    "--secret-file",
    "secret_files",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help=f"A file holding the endpoint secret (whsec_...), one per line (two during a rotation). Or set {SECRET_ENV}.",
)
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    help=f"Discouraged: the secret on the command line, where `ps` shows it to every user of the machine "
    f"(use --secret-file or {SECRET_ENV}).",
)
@click.option("--issuer", default=None, help="Expected issuer (the forgehand instance id).")
@click.option("--deny-tool-pattern", default=None, callback=_pattern, help="Deny tools whose name matches (regex).")
@click.option(
    "--ask-tool-pattern",
    default=None,
    callback=_pattern,
    help="Answer ask (a person decides on the task page) for tool calls matching (regex, searched in the tool "
    "name and, for tools with a command, in 'TOOL: COMMAND'). --deny-tool-pattern wins.",
)
@click.option("--redact-prompt-pattern", default=None, callback=_pattern, help="Redact matching prompt text (regex).")
@click.option("--log-only", is_flag=True, help="Log every event, never answer with a decision.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=9000, show_default=True)
def serve(
    audience: str,
    secret_files: tuple[Path, ...],
    secrets: tuple[str, ...],
    issuer: str | None,
    deny_tool_pattern: str | None,
    ask_tool_pattern: str | None,
    redact_prompt_pattern: str | None,
    log_only: bool,
    host: str,
    port: int,
) -> None:
    """Run the reference consumer: one JSON line per event on stdout."""
    from webhooks.sdk.reference import make_consumer, make_server

    found = endpoint_secrets(secret_files, secrets)
    if secrets:
        click.echo(
            f"forgehand hooks: warning: --secret is visible to every user of this machine (ps); "
            f"use --secret-file or {SECRET_ENV}",
            err=True,
        )
    try:
        consumer = make_consumer(
            audience=audience,
            secrets=found,
            issuer=issuer,
            deny_tool_pattern=deny_tool_pattern,
            ask_tool_pattern=ask_tool_pattern,
            redact_prompt_pattern=redact_prompt_pattern,
            log_only=log_only,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    server = make_server(consumer, host, port)
    click.echo(f"forgehand hooks consumer on http://{host}:{server.server_port} for {audience}", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
