"""`forgehand sandbox build|ls|reap` against the real engine."""

import asyncio

import pytest
from click.testing import CliRunner

from sandbox import SandboxEngine, list_sandboxes
from sandbox.cli import sandbox_group

from .conftest import INSTANCE, SpecFactory


def test_build_is_idempotent(sandbox_image: str) -> None:
    result = CliRunner().invoke(sandbox_group, ["build", "--image", sandbox_image])
    assert result.exit_code == 0, result.output
    assert "up to date" in result.output


async def test_ls_and_reap(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    sb = await engine.start(make_spec(run="cli-run"))
    try:
        runner = CliRunner()
        listed = await asyncio.to_thread(runner.invoke, sandbox_group, ["ls", "--instance", INSTANCE])
        assert listed.exit_code == 0, listed.output
        assert "cli-run" in listed.output and "running" in listed.output
        reaped = await asyncio.to_thread(
            runner.invoke, sandbox_group, ["reap", "--instance", INSTANCE, "--keep", "something-else"]
        )
        assert reaped.exit_code == 0, reaped.output
        assert "cli-run" in reaped.output
        assert "cli-run" not in {s.run for s in await list_sandboxes(engine, INSTANCE)}
    finally:
        await sb.remove()


def test_no_engine_fails_with_a_hint() -> None:
    result = CliRunner().invoke(sandbox_group, ["ls", "--docker-host", "unix:///nonexistent/docker.sock"])
    assert result.exit_code == 1
    assert "start Docker" in result.output


def test_reap_needs_an_instance(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FORGEHAND_INSTANCE_ID", raising=False)
    result = CliRunner().invoke(sandbox_group, ["reap"])
    assert result.exit_code == 2
    assert "name the instance" in result.output
