"""The error-code registry: every code the source uses is registered (with the status it is raised
with), docs/api.md lists exactly the registry, and an unregistered code fails when it is built."""

import ast
import re
from pathlib import Path

import pytest

from forge.core import errors
from forge.core.error_codes import Code, UnknownErrorCode, lookup, markdown_rows
from forge.core.errors import ForgeError, InvalidInput, NotFound
from forge.git import errors as git_errors
from forge.http.problems import Problem

ROOT = Path(__file__).resolve().parents[4]
SCANNED = ("forge", "tasks", "webhooks")


def _trees() -> list[tuple[Path, ast.Module]]:
    return [(p, ast.parse(p.read_text(), str(p))) for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))]


def _error_statuses(trees: list[tuple[Path, ast.Module]]) -> dict[str, int]:
    """Class name -> status, for forge.core.errors and every subclass of them defined in the tree."""
    statuses = {
        name: cls.status for name, cls in vars(errors).items() if isinstance(cls, type) and issubclass(cls, ForgeError)
    }
    defined = [n for _, t in trees for n in ast.walk(t) if isinstance(n, ast.ClassDef)]
    changed = True
    while changed:
        changed = False
        for node in defined:
            bases = [b.id for b in node.bases if isinstance(b, ast.Name) and b.id in statuses]
            if node.name not in statuses and bases:
                statuses[node.name] = statuses[bases[0]]
                changed = True
    return statuses


def _code_arguments(trees: list[tuple[Path, ast.Module]]) -> list[tuple[str, str, str]]:
    """(where, callee, code) for each `code="..."` or `code=Code.NAME` keyword argument in the tree."""
    found = []
    for path, tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            for kw in node.keywords:
                value = kw.value
                if kw.arg != "code":
                    continue
                if isinstance(value, ast.Constant) and isinstance(value.value, str):
                    code = value.value
                elif isinstance(value, ast.Attribute) and getattr(value.value, "id", None) == "Code":
                    member = Code.__members__.get(value.attr)
                    code = member.value if member is not None else f"Code.{value.attr}"
                else:
                    continue
                found.append((f"{path.relative_to(ROOT)}:{node.lineno}", callee, code))
    return found


def test_every_code_in_the_source_is_registered_with_the_status_it_is_raised_with() -> None:
    trees = _trees()
    statuses = _error_statuses(trees)
    arguments = _code_arguments(trees)
    assert len(arguments) > 100  # the scan sees the raise sites of forge/, tasks/ and webhooks/
    wrong = []
    for where, callee, code in arguments:
        try:
            lookup(code, statuses.get(callee))
        except UnknownErrorCode as exc:
            wrong.append(f"{where}: {exc}")
    assert wrong == []


def test_every_registry_reference_in_the_source_names_a_member() -> None:
    members = set(Code.__members__)
    refs = [
        (f"{path.relative_to(ROOT)}:{node.lineno}", node.attr)
        for path, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Code"
    ]
    assert refs  # forge/ uses the names
    assert [r for r in refs if r[1] not in members and r[1] not in {"status", "meaning", "also", "statuses"}] == []


def test_the_default_codes_and_the_git_layer_codes_are_registered() -> None:
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, ForgeError):
            assert lookup(cls.default_code, cls.status) is cls.default_code
    git_codes = {cls.code for cls in vars(git_errors).values() if isinstance(cls, type) and issubclass(cls, Exception)}
    git_codes.discard(getattr(Exception, "code", None))
    assert {"repo_error", "git_failed", "merge_conflict", "push_too_large"} <= git_codes
    for code in git_codes:
        lookup(code)


def _docs_rows() -> list[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("<!-- error-codes:start -->", 1)[1].split("<!-- error-codes:end -->", 1)[0]
    return [line for line in section.splitlines() if re.match(r"\| `", line)]


def test_the_docs_table_is_the_registry() -> None:
    rows = _docs_rows()
    parsed = [(r.split("|")[1].strip(" `"), r.split("|")[2].strip()) for r in rows]
    assert parsed == [(c.value, ", ".join(map(str, c.statuses))) for c in Code]
    assert rows == markdown_rows()  # the meanings too: regenerate with `python -m forge.core.error_codes`


def test_an_unregistered_code_fails_when_the_error_is_built() -> None:
    with pytest.raises(UnknownErrorCode, match="not registered"):
        NotFound("nothing", code="no_such_code_anywhere")
    with pytest.raises(UnknownErrorCode, match="not registered"):
        Problem(title="x", status=404, detail="x", code="no_such_code_anywhere")


def test_a_code_raised_with_another_status_than_its_own_fails() -> None:
    with pytest.raises(UnknownErrorCode, match="status"):
        NotFound("taken", code="repo_exists")
    with pytest.raises(UnknownErrorCode, match="status"):
        Problem(title="x", status=500, detail="x", code="repo_not_found")
    # The catch-alls stand for any status the framework raised; codes with two steps take both.
    Problem(title="x", status=416, detail="x", code="bad_request")
    assert InvalidInput("gone", code="base_not_found").status == 422
    assert NotFound("x").code == "not_found"
