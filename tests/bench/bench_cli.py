"""`forgehand --help` (and a command's help) against `python -c pass` and `python -c "import click"`,
each the best of RUNS runs in this same run: the command line must cost little more than starting
Python and click (it imports the app, the database and Docker only inside the command that runs).

Goal: `forgehand --help` at most 4x `python -c pass` (it was about 30x when every command's
dependencies were imported up front; on a quiet machine it now takes about 0.1 s).
"""

import subprocess
import sys
import time
from pathlib import Path

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))
RUNS = 10


def _best(argv: list[str]) -> float:
    best = float("inf")
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, check=True)
        best = min(best, time.perf_counter() - start)
    return best


def test_bench_cli_help() -> None:
    python = _best([sys.executable, "-c", "pass"])
    click = _best([sys.executable, "-c", "import click"])
    timings = {
        " ".join(args): _best([FORGEHAND, *args])
        for args in (["--help"], ["users", "list", "--help"], ["sandbox", "--help"], ["hooks", "serve", "--help"])
    }
    print(f"\npython -c pass {python * 1000:.0f} ms, python -c 'import click' {click * 1000:.0f} ms")
    for args, seconds in timings.items():
        print(f"forgehand {args}: {seconds * 1000:.0f} ms, ratio {seconds / python:.1f} to python -c pass (goal <= 4)")
    assert timings["--help"] <= 4 * python
