"""First start: the instance admin (password printed once and kept in a 0600 file)."""

import os
from pathlib import Path

from forge import accounts
from forge.audit import Actor
from forge.db import Database
from forge.security import generate_password
from forge.settings import Settings

# "admin" is a reserved path segment (/admin); GitLab-style "root" it is.
ADMIN_LOGIN = "root"
PASSWORD_FILE = "admin-password.txt"


async def ensure_admin(db: Database, settings: Settings) -> str | None:
    """Create the first admin when there is no account yet. Returns the password when created."""
    async with db.session(write=True) as session:
        if await accounts.count_accounts(session):
            return None
        password = generate_password()
        await accounts.create_user(session, Actor.system("bootstrap"), ADMIN_LOGIN, password, is_admin=True)
    path: Path = settings.data_dir / PASSWORD_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(f"login: {ADMIN_LOGIN}\npassword: {password}\n")
    return password
