"""`forgehand hooks ...`: the reference consumer."""

import re

import click

from webhooks.protocol import decode_secret


def _pattern(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        re.compile(value)
    except re.error as exc:
        raise click.BadParameter(f"not a regular expression: {exc}") from None
    return value


def _secrets(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    for secret in value:
        try:
            decode_secret(secret)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return list(value)


@click.group("hooks")
def hooks_group() -> None:
    """Webhook tools: the reference consumer."""


@hooks_group.command("serve")
@click.option("--audience", required=True, help="The endpoint URL exactly as configured in forgehand.")
@click.option(
    "--secret",
    "secrets",
    multiple=True,
    required=True,
    callback=_secrets,
    envvar="FORGEHAND_HOOKS_SECRET",
    help="The endpoint secret (whsec_...); repeat during a rotation.",
)
@click.option("--issuer", default=None, help="Expected issuer (the forgehand instance id).")
@click.option("--deny-tool-pattern", default=None, callback=_pattern, help="Deny tools whose name matches (regex).")
@click.option("--redact-prompt-pattern", default=None, callback=_pattern, help="Redact matching prompt text (regex).")
@click.option("--log-only", is_flag=True, help="Log every event, never answer with a decision.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=9000, show_default=True)
def serve(
    audience: str,
    secrets: list[str],
    issuer: str | None,
    deny_tool_pattern: str | None,
    redact_prompt_pattern: str | None,
    log_only: bool,
    host: str,
    port: int,
) -> None:
    """Run the reference consumer: one JSON line per event on stdout."""
    from webhooks.reference import make_consumer, make_server

    try:
        consumer = make_consumer(
            audience=audience,
            secrets=secrets,
            issuer=issuer,
            deny_tool_pattern=deny_tool_pattern,
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
