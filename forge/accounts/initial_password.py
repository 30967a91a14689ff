"""The first admin's generated password, kept for the operator in `<data>/admin-password.txt`
(mode 0600) until that person chooses their own: changing it removes the file, which from then on
would only hold a password that no longer works."""

import os
from pathlib import Path

PASSWORD_FILE = "admin-password.txt"


def write(data_dir: Path, login: str, password: str) -> Path:
    path = data_dir / PASSWORD_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"login: {login}\npassword: {password}\n")
    return path


def discard(data_dir: Path, login: str) -> bool:
    """Remove the file when it holds `login`'s password; True when it was removed."""
    path = data_dir / PASSWORD_FILE
    try:
        first = path.read_text(encoding="utf-8").partition("\n")[0]
    except (FileNotFoundError, UnicodeDecodeError):
        return False
    if first.removeprefix("login:").strip().lower() != login.lower():
        return False
    path.unlink(missing_ok=True)
    return True
