"""Migrations expand, then contract (docs/contributing.md): replicas of the previous release keep
serving while the next release migrates the database under them, so a migration may add to the
schema but not take away from it or tighten what the previous release still uses.

The guard reads every migration from FIRST_GUARDED on (their text: it imports none of them) and
fails on a contraction in its upgrade (anything outside `downgrade`):
- a table or column dropped or renamed (`drop_table`, `drop_column`, `rename_table`,
  `alter_column(new_column_name=...)`, on `op` or in a batch);
- a column made NOT NULL without a server default (`alter_column(nullable=False)`), or one added
  NOT NULL without a server default (the previous release's inserts do not set it);
- the same in raw SQL (`op.execute`: DROP, RENAME, SET NOT NULL);
unless its docstring has a line `Contract: follows NNNN`: the revision of the release whose code
stopped using what this migration removes, older than this one (that release has shipped, so the
previous release, the one that keeps serving during this upgrade, does not use it).

What the text cannot show (a type narrowed, a row rewritten in a form the old code misreads) is
the job of the two-release test, tests/integration/forge/db/test_upgrade_two_releases.py."""

import ast
import re
from dataclasses import dataclass

import pytest

from forge.db.migrate import MIGRATIONS

VERSIONS = MIGRATIONS / "versions"

FIRST_GUARDED = "0044"
"""The first migration under the rule: the release of the workers' register, whose replicas and
workers upgrade one by one (docs/operator.md, "Upgrading"). 0001-0043 keep to it too; they are
history, left out so that a stricter rule later need not rewrite them."""

DROPS = frozenset({"drop_table", "drop_column", "rename_table"})
CONTRACT_LINE = re.compile(r"^Contract:\s*follows\s+(\S+)", re.MULTILINE)
CONTRACTING_SQL = re.compile(r"\bDROP\s+(TABLE|COLUMN)\b|\bRENAME\b|\bSET\s+NOT\s+NULL\b", re.IGNORECASE)


@dataclass(frozen=True)
class Migration:
    name: str
    revision: str
    down_revision: str | None
    docstring: str
    contractions: list[str]


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_false(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is False


def _not_null_without_default(call: ast.Call) -> bool:
    return _is_false(_keyword(call, "nullable")) and _keyword(call, "server_default") is None


def _contraction(call: ast.Call) -> str | None:
    """What a call of a migration takes away from the schema the previous release uses, or None."""
    if not isinstance(call.func, ast.Attribute):
        return None
    method = call.func.attr
    if method in DROPS:
        return method
    if method == "alter_column":
        if _keyword(call, "new_column_name") is not None:
            return "alter_column(new_column_name=...): a rename"
        if _not_null_without_default(call):
            return "alter_column(nullable=False) without a server_default"
    if method == "add_column":
        for column in call.args:
            if isinstance(column, ast.Call) and _not_null_without_default(column):
                return "add_column of a NOT NULL column without a server_default"
    if method == "execute":
        sql = " ".join(
            node.value
            for arg in call.args
            for node in ast.walk(arg)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        )
        found = CONTRACTING_SQL.search(sql)
        if found:
            return f"execute({found.group(0).upper()} ...)"
    return None


def _upgrade_calls(tree: ast.Module) -> list[ast.Call]:
    """Every call of the module outside `downgrade` (upgrade itself and any helper it uses)."""
    calls: list[ast.Call] = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef) and node.name == "downgrade":
            continue
        if isinstance(node, ast.Call):
            calls.append(node)
        pending.extend(ast.iter_child_nodes(node))
    return sorted(calls, key=lambda c: c.lineno)


def _assigned(tree: ast.Module, name: str) -> str | None:
    for node in tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(value, ast.Constant):
            return None if value.value is None else str(value.value)
    return None


def parse(name: str, source: str) -> Migration:
    tree = ast.parse(source)
    revision = _assigned(tree, "revision")
    assert revision, f"{name}: no `revision = ...`"
    contractions = []
    for call in _upgrade_calls(tree):
        what = _contraction(call)
        if what is not None:
            contractions.append(f"line {call.lineno}: {what}")
    return Migration(
        name=name,
        revision=revision,
        down_revision=_assigned(tree, "down_revision"),
        docstring=ast.get_docstring(tree) or "",
        contractions=contractions,
    )


def _older(revision: str, chain: dict[str, str | None]) -> list[str]:
    """The revisions `revision` follows, newest first."""
    older: list[str] = []
    down = chain.get(revision)
    while down is not None:
        older.append(down)
        down = chain.get(down)
    return older


def problems(migration: Migration, chain: dict[str, str | None]) -> list[str]:
    """Why `migration` breaks expand/contract ([] when it does not): `chain` maps each revision
    to the one it revises."""
    if not migration.contractions:
        return []
    declared = CONTRACT_LINE.search(migration.docstring)
    if declared is None:
        return [
            f"{migration.name} {c}: the previous release may still use it; expand now and contract one "
            "release later (docstring line `Contract: follows NNNN`, docs/contributing.md)"
            for c in migration.contractions
        ]
    follows = declared.group(1)
    if follows not in _older(migration.revision, chain):
        return [f"{migration.name}: `Contract: follows {follows}` names no revision older than {migration.revision}"]
    return []


def _all_migrations() -> list[Migration]:
    return [parse(p.name, p.read_text(encoding="utf-8")) for p in sorted(VERSIONS.glob("[0-9]*.py"))]


def test_migrations_expand_and_contract_only_one_release_later() -> None:
    migrations = _all_migrations()
    chain = {m.revision: m.down_revision for m in migrations}
    assert FIRST_GUARDED in chain, f"no migration {FIRST_GUARDED} in {VERSIONS}"
    guarded = [m for m in migrations if FIRST_GUARDED in [m.revision, *_older(m.revision, chain)]]
    assert guarded, "no migration to guard"
    found = [p for m in guarded for p in problems(m, chain)]
    assert found == [], "\n".join(found)


# The guard itself: what it sees, what it lets through.

HEADER = '"""{doc}\n"""\nrevision: str = "0046"\ndown_revision: str | None = "0045"\n\n'
CHAIN: dict[str, str | None] = {"0046": "0045", "0045": "0044", "0044": None}


def _migration(upgrade: str, doc: str = "a migration", downgrade: str = "pass") -> Migration:
    body = "\n".join("    " + line for line in upgrade.strip().splitlines())
    down = "\n".join("    " + line for line in downgrade.strip().splitlines())
    return parse(
        "0046_x.py", HEADER.format(doc=doc) + f"def upgrade() -> None:\n{body}\n\n\ndef downgrade() -> None:\n{down}\n"
    )


@pytest.mark.parametrize(
    "upgrade",
    [
        'op.drop_table("old")',
        'op.drop_column("tasks", "old")',
        'with op.batch_alter_table("tasks") as batch_op:\n    batch_op.drop_column("old")',
        'op.rename_table("old", "new")',
        'op.alter_column("tasks", "old", new_column_name="new")',
        'with op.batch_alter_table("tasks") as batch_op:\n    batch_op.alter_column("old", new_column_name="new")',
        'op.alter_column("tasks", "note", nullable=False)',
        'with op.batch_alter_table("tasks") as b:\n    b.alter_column("note", existing_type=sa.Text(), nullable=False)',
        'op.add_column("tasks", sa.Column("note", sa.Text(), nullable=False))',
        'op.execute("ALTER TABLE tasks DROP COLUMN old")',
        'op.execute(sa.text("alter table tasks alter column note set not null"))',
        'op.execute("ALTER TABLE tasks RENAME COLUMN old TO new")',
    ],
)
def test_the_guard_sees_a_contraction(upgrade: str) -> None:
    migration = _migration(upgrade)
    assert len(migration.contractions) == 1, migration
    assert problems(migration, CHAIN)[0].startswith("0046_x.py line ")


@pytest.mark.parametrize(
    "upgrade",
    [
        'op.create_table("new", sa.Column("id", sa.Integer(), nullable=False))',
        'op.add_column("tasks", sa.Column("note", sa.Text(), nullable=True))',
        'op.add_column("tasks", sa.Column("labels", sa.JSON(), server_default=sa.text("\'[]\'"), nullable=False))',
        'op.alter_column("tasks", "note", nullable=False, server_default="")',
        'op.alter_column("tasks", "note", nullable=True)',
        'op.create_index("ix_tasks_note", "tasks", ["note"])',
        "op.execute(\"UPDATE tasks SET note = '' WHERE note IS NULL\")",
    ],
)
def test_an_expansion_passes(upgrade: str) -> None:
    migration = _migration(upgrade, downgrade='op.drop_column("tasks", "note")\nop.drop_table("new")')
    assert migration.contractions == [] and problems(migration, CHAIN) == []


def test_a_contraction_passes_once_it_names_an_older_release() -> None:
    drop = 'op.drop_column("tasks", "old")'
    assert (
        problems(_migration(drop, doc="drop tasks.old\n\nContract: follows 0045 (its code reads it no more)"), CHAIN)
        == []
    )
    assert problems(_migration(drop, doc="drop tasks.old\n\nContract: follows 0044"), CHAIN) == []
    for wrong in ("0046", "0047", "latest"):
        found = problems(_migration(drop, doc=f"drop tasks.old\n\nContract: follows {wrong}"), CHAIN)
        assert found == [f"0046_x.py: `Contract: follows {wrong}` names no revision older than 0046"]
    assert problems(_migration(drop, doc="drop tasks.old\n\nContract: yes"), CHAIN) != []
