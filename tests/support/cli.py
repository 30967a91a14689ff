"""The `forgehand` command run in the test's own process (click's runner), with the environment an
operator's shell would give it: only the FORGEHAND_ variables named, every other one unset.

A real `forgehand` process costs about a second of interpreter start and imports (several under
the parallel suite); in-process it costs milliseconds, and what is checked (exit status, one-line
errors, what was written) is the same code. `tests/integration/forge/app/test_cli.py` keeps real processes
for what only a process shows: the working directory, the console script and a bad environment.
"""

import os
import traceback
from dataclasses import dataclass
from pathlib import Path

from click.testing import CliRunner

from forge.app.cli import main


@dataclass(frozen=True)
class Ran:
    """A finished command, named like `subprocess.CompletedProcess` so tests read the same."""

    returncode: int
    stdout: str
    stderr: str


def forgehand(*args: str, env: dict[str, str], input_: str | None = None, cwd: Path | None = None) -> Ran:
    """Run `forgehand ARGS` in-process. An exception the command did not turn into an exit status
    (what a user would see as a traceback) is written to stderr as one, so tests can say it must not."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("FORGEHAND_")}
    before = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        r = CliRunner().invoke(main, list(args), input=input_, env={**unset, **env}, catch_exceptions=True)
    finally:
        os.chdir(before)
    stderr = r.stderr
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(r.exception))
    return Ran(returncode=r.exit_code, stdout=r.stdout, stderr=stderr)


def instance_env(data_dir: Path, db_url: str) -> dict[str, str]:
    return {"FORGEHAND_DATA_DIR": str(data_dir), "FORGEHAND_DATABASE_URL": db_url}
