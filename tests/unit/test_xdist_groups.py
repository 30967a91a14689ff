"""The suite's `xdist_group` marks take effect (tests/support/xdist_groups.py): a pytest run with
two workers and `--dist loadgroup`, as the suite runs, over a few tests of one group and a few
without; every test of the group reports the same worker."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GROUPED = """
import os
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("n", range(4))
def test_grouped(n):
    with open(os.environ["GROUP_LOG"], "a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")
"""

LOOSE = """
import os
import pytest


@pytest.mark.parametrize("n", range(6))
def test_loose(n):
    pass
"""

CONFTEST = """
from tests.support import xdist_groups


def pytest_collection_modifyitems(config, items):
    xdist_groups.apply(config, items)
"""


def test_a_groups_tests_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "test_other_grouped.py").write_text(GROUPED.replace("test_grouped", "test_also_grouped"))
    (tmp_path / "test_loose.py").write_text(LOOSE)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    log = tmp_path / "workers.log"
    # The run's own options only: not the outer run's PYTEST_ADDOPTS (its plugins, say).
    outer = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env = outer | {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "GROUP_LOG": str(log),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    workers = log.read_text().split()
    assert len(workers) == 8 and len(set(workers)) == 1, workers
    assert "14 passed" in done.stdout
