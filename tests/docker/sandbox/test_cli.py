"""`forgehand sandbox build|ls|reap` against the real engine."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from sandbox import SandboxEngine, list_sandboxes
from sandbox.cli import sandbox_group
from tests.docker.conftest import INSTANCE, SpecFactory


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


async def test_ls_off_a_terminal_prints_every_value_whole(engine: SandboxEngine, make_spec: SpecFactory) -> None:
    # Long labels and a long container name: far wider than the 80 columns a table gets off a terminal.
    task, run = "t" * 60, "whole-run-" + "r" * 40
    sb = await engine.start(make_spec(task=task, run=run))
    try:
        forgehand = str(Path(sys.executable).with_name("forgehand"))
        env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
        listed = await asyncio.to_thread(
            subprocess.run,
            [forgehand, "sandbox", "ls", "--instance", INSTANCE],
            capture_output=True, text=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        lines = listed.stdout.splitlines()
        assert lines[0] == "container\tinstance\ttask\trun\tstatus\tcreated\tweakened\tcreator"
        mine = [line.split("\t") for line in lines[1:] if line.startswith(sb.name + "\t")]
        assert len(mine) == 1, listed.stdout
        assert mine[0][1:5] == [INSTANCE, task, run, "running"]
        assert len(sb.name) > 60 and "…" not in listed.stdout
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
