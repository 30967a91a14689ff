"""First start: the instance admin, with a generated password printed once and kept in a 0600 file
(`forge.accounts.initial_password`) until they change it, which they must do at their first sign-in."""

from sqlalchemy.exc import IntegrityError

from forge.accounts import accounts, initial_password
from forge.accounts.initial_password import PASSWORD_FILE
from forge.core.errors import Conflict
from forge.core.security import generate_password
from forge.core.settings import Settings
from forge.db.audit import Actor
from forge.db.engine import Database

# "admin" is a reserved path segment (/admin); GitLab-style "root" it is.
ADMIN_LOGIN = "root"
__all__ = ["ADMIN_LOGIN", "PASSWORD_FILE", "ensure_admin"]


async def ensure_admin(db: Database, settings: Settings) -> str | None:
    """Create the first admin when there is no account yet. Returns the password when created.

    Replicas started together on an empty database may all find no account: the login's unique
    key lets one create it, and the others go on without (None), the admin being there."""
    password = generate_password()
    try:
        async with db.session(write=True) as session:
            if await accounts.count_accounts(session):
                return None
            await accounts.create_user(
                session, Actor.system("bootstrap"), ADMIN_LOGIN, password, is_admin=True, must_change_password=True
            )
    except (IntegrityError, Conflict):
        return None  # another replica created it first (its insert, or its commit, came first)
    initial_password.write(settings.data_dir, ADMIN_LOGIN, password)
    return password
