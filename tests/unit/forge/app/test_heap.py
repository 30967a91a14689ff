"""The startup heap frozen out of the collector's full collections (forge/app/heap.py), in a process of
its own (a frozen heap stays frozen for the process's life)."""

import subprocess
import sys

SCRIPT = """
import gc, pathlib, tempfile
from forge.app.factory import create_app
from forge.app.heap import freeze_startup_heap
from forge.core.settings import load_settings, prepare_data_dir
d = pathlib.Path(tempfile.mkdtemp())
settings = prepare_data_dir(load_settings(environ={}, data_dir=d / "data", database_url=f"sqlite+aiosqlite:///{d}/f.db"))
app = create_app(settings)
before = len(gc.get_objects())
freeze_startup_heap()
print(before, gc.get_freeze_count(), len(gc.get_objects()))
"""


def test_the_app_s_startup_heap_is_frozen_and_a_full_collection_walks_only_what_came_after() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    before, frozen, walked = (int(n) for n in out.stdout.split())
    assert before > 50_000  # what a built app holds (the pause the freeze saves grows with it)
    assert frozen >= before * 0.9
    assert walked < 1_000  # what a full collection still looks at
