"""`forgehand serve` as its own process (its in-process worker, the real engine), for benchmarks:
a fresh data directory with the demo world seeded, then the server up on a free port."""

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from forge.core.settings import Settings, load_settings, prepare_data_dir
from forge.db.migrate import upgrade_async
from tests.support.tasks import seed
from tests.support.waiting import until_sync

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))


async def prepare(tmp: Path, port: int) -> tuple[Settings, str]:
    """Settings on a fresh SQLite data directory, migrated and seeded; a token of ana's."""
    data = tmp / "data"
    url = f"sqlite+aiosqlite:///{(data / 'forgehand.db').resolve()}"
    settings = prepare_data_dir(
        load_settings(environ={}, data_dir=data, database_url=url, port=port, seed_demo=False, log_level="warning")
    )
    await upgrade_async(url)
    token, _ = await seed(settings)
    return settings, token


@contextmanager
def serving(settings: Settings, port: int, **extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """`forgehand serve` on `port` with the settings' data directory and database (and `extra`
    FORGEHAND_* variables, which win over these), up and healthy; terminated on exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update(
        {
            "FORGEHAND_DATA_DIR": str(settings.data_dir),
            "FORGEHAND_DATABASE_URL": settings.effective_database_url,
            "FORGEHAND_PORT": str(port),
            "FORGEHAND_SEED_DEMO": "false",
            "FORGEHAND_LOG_LEVEL": "warning",
            "FORGEHAND_RUN_WORKER": "true",
        }
        | extra
    )
    server = subprocess.Popen([FORGEHAND, "serve"], env=env, stdout=subprocess.DEVNULL)
    try:

        def healthy() -> bool:
            assert server.poll() is None, "forgehand serve exited before it was healthy"
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200

        until_sync(healthy, timeout=60, what="forgehand serve to answer /healthz", ignoring=(httpx.TransportError,))
        yield server
    finally:
        server.terminate()
        server.wait(timeout=60)
