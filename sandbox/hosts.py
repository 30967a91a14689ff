"""The host file a sandbox without Docker's networking shows as /etc/hosts (`SandboxSpec.hosts_file`)."""

import contextlib
import os
import secrets
import stat
from pathlib import Path

from .spec import HOSTS_TEXT

_MODE = 0o644  # the sandbox user reads it through its read-only mount


def ensure_hosts_file(path: Path) -> None:
    """Make `path` a regular file of this process's user, mode 0644, holding HOSTS_TEXT, unless it
    is one already. Anything else there (other content, another mode or owner, a symlink, which
    the engine's daemon would follow as root) is replaced: written beside and renamed into place,
    so that a container being created from the same file never sees it half-written. Blocking;
    OSError when the directory cannot be made or written."""
    if _is_ours(path):
        return
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, _MODE)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), _MODE)  # whatever the umask took away
            out.write(HOSTS_TEXT)
        staged.replace(path)  # a symlink at `path` is replaced itself, its target left alone
    finally:
        staged.unlink(missing_ok=True)


def _is_ours(path: Path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False  # missing, or a symlink (ELOOP)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != _MODE:
            return False
        with contextlib.suppress(UnicodeDecodeError):
            return f.read(len(HOSTS_TEXT) + 1).decode() == HOSTS_TEXT
    return False
