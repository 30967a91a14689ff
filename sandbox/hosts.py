"""The host file a sandbox without Docker's networking shows as /etc/hosts (`SandboxSpec.hosts_file`)."""

import contextlib
import os
import secrets
from pathlib import Path

from .spec import HOSTS_TEXT


def ensure_hosts_file(path: Path) -> None:
    """Write HOSTS_TEXT at `path` unless it is there already (readable by all: the sandbox user
    reads it through its read-only mount). Written beside and renamed into place, so that a
    container being created elsewhere from the same file never sees it half-written. Blocking."""
    with contextlib.suppress(FileNotFoundError):
        if path.read_text(encoding="utf-8") == HOSTS_TEXT:
            return
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        staged.write_text(HOSTS_TEXT, encoding="utf-8")
        staged.chmod(0o644)
        staged.replace(path)
    finally:
        staged.unlink(missing_ok=True)
