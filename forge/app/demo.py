"""First-start demo data: a repository `root/demo` with a few files and a bot `demo-agent` with
write access to it, so a newcomer can clone, push, browse and start a task at once."""

from sqlalchemy.ext.asyncio import AsyncSession

from forge.accounts import accounts
from forge.db.audit import Actor
from forge.db.engine import Database
from forge.db.events import EventBus
from forge.git import Identity, RepoStore
from forge.git.bare import write_commit
from forge.repos import collaborators, lifecycle, repositories

DEMO_REPO = "demo"
DEMO_BOT = "demo-agent"

_FILES: dict[str, str] = {
    "README.md": (
        "# demo\n\nA repository seeded by forgehand on its first start.\n\n"
        "- Clone it: `git clone http://127.0.0.1:8000/root/demo.git` (user: anything, password: a token)\n"
        "- Start a task on it with the `command` runtime and the `demo-agent` bot.\n"
    ),
    "hello.py": 'def greet(name: str) -> str:\n    return f"Hello, {name}!"\n\n\nif __name__ == "__main__":\n'
    '    print(greet("forgehand"))\n',
    "test_hello.py": "from hello import greet\n\n\ndef test_greet() -> None:\n"
    '    assert greet("ana") == "Hello, ana!"\n',
    ".gitignore": "__pycache__/\n",
}


async def seed(db: Database, store: RepoStore, bus: EventBus, admin_login: str) -> str | None:
    """Create the demo when the instance has no repository yet. Returns its full name when created."""
    actor = Actor.system("demo")
    async with db.session(write=True) as session:
        if await repositories.count(session):
            return None
        admin = await accounts.require_by_login(session, admin_login)
        bot = await accounts.get_by_login(session, DEMO_BOT) or await accounts.create_bot(
            session, actor, DEMO_BOT, owner=admin, display_name="Demo agent"
        )
        repo = await lifecycle.create(
            session, store, bus, actor, admin, DEMO_REPO, description="forgehand's demo repository", auto_init=False
        )
        res = await repositories.resource_for(session, repo, actor.principal)
        await store.write(
            res.key,
            write_commit,
            branch=repo.default_branch,
            files=_FILES,
            message="Demo: a tiny Python project",
            author=Identity(name=admin.login, email=f"{admin.login}@users.noreply.forgehand"),
        )
        await collaborators.set_collaborator(session, actor, res, bot.login, "write")
        return await _name(session, res)


async def _name(session: AsyncSession, res: repositories.RepoResource) -> str:
    await session.flush()
    return res.full_name
