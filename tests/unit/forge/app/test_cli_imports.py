"""`forgehand --help` and each command's help load click and the command line alone: the app, the
database, Docker and the webhooks machinery are imported by the command that needs them."""

import subprocess
import sys

import pytest

HEAVY = ("litestar", "sqlalchemy", "docker", "pygit2", "uvicorn", "httpx", "rich", "alembic")

PROBE = f"""
import sys
from forge.app.cli import main
try:
    main(sys.argv[1:], prog_name="forgehand")
except SystemExit as exc:
    assert exc.code == 0, exc.code
heavy = sorted({{name.split(".")[0] for name in sys.modules}} & {set(HEAVY)!r})
print("HEAVY=" + ",".join(heavy), file=sys.stderr)
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["users", "--help"],
        ["users", "list", "--help"],
        ["tokens", "create", "--help"],
        ["serve", "--help"],
        ["worker", "--help"],
        ["db", "upgrade", "--help"],
        ["db", "copy", "--help"],
        ["sandbox", "--help"],
        ["sandbox", "ls", "--help"],
        ["hooks", "serve", "--help"],
    ],
)
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    r = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stderr
    assert "Usage: forgehand" in r.stdout
    assert r.stderr.strip().splitlines()[-1] == "HEAVY=", r.stderr


def test_top_level_help_lists_the_groups_it_has_not_loaded() -> None:
    r = subprocess.run(
        [sys.executable, "-c", "from forge.app.cli import main; main(['--help'], prog_name='forgehand')"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "sandbox  Build, list and reap sandbox images and containers." in r.stdout
    assert "hooks    Webhook tools: the reference consumer." in r.stdout
    assert "--data-dir DIRECTORY" in r.stdout


def test_lazy_groups_say_what_their_own_help_says() -> None:
    import click

    from forge.app.cli import LAZY_GROUPS, main

    for name, (_, _, short) in LAZY_GROUPS.items():
        group = main.get_command(click.Context(main), name)
        assert group is not None and group.get_short_help_str(200) == short
