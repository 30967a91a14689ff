"""CODEOWNERS: who owns which paths, in GitHub's syntax, read from the base branch of a pull
request (`.forgehand/CODEOWNERS`, `.github/CODEOWNERS`, `CODEOWNERS` or `docs/CODEOWNERS`, the
first found).

Each line is a pattern (gitignore's rules, matched by `pathspec`) and the owners of the paths it
matches, as `@login`; `#` starts a comment; the last matching line wins, and a line with no
owners means nobody owns those paths. With the branch rule `require_code_owner_review`, every
changed path that has owners needs a standing approval from one of them (forge/repos/merge_rules.py).

A file that cannot be read as rules fails closed: each problem is reported on the pull request as
an unmet rule naming its line (negation `!`, team and e-mail owners, an owner who is not an
account, a pattern gitignore would refuse), and the pull request does not merge until the file
on the base is fixed."""

from dataclasses import dataclass, field

import pygit2
from pathspec import GitIgnoreSpec

from forge.git import NotABlob, PathNotFound, read_blob

LOCATIONS = (".forgehand/CODEOWNERS", ".github/CODEOWNERS", "CODEOWNERS", "docs/CODEOWNERS")
MAX_BYTES = 3 * 1024 * 1024  # GitHub's limit for the file
MAX_RULES = 2000  # each changed path is matched against every rule
MAX_ERRORS = 10


@dataclass(frozen=True, slots=True)
class Rule:
    line: int
    pattern: GitIgnoreSpec
    owners: tuple[str, ...]  # logins, lower case


@dataclass(frozen=True, slots=True)
class CodeOwners:
    path: str  # where it was read ("" when the base has none)
    rules: list[Rule] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def owners_of(self, path: str) -> tuple[str, ...]:
        """The owners of `path`: those of the last matching line (none: unowned)."""
        found: tuple[str, ...] = ()
        for rule in self.rules:
            if rule.pattern.match_file(path):
                found = rule.owners
        return found


def _owner(token: str, line: int) -> tuple[str | None, str | None]:
    """(login, error) for one owner token."""
    if "@" in token and not token.startswith("@"):
        return None, f"CODEOWNERS line {line}: e-mail owners ({token}) are not supported: name the account as @login"
    if not token.startswith("@") or len(token) < 2:
        return None, f"CODEOWNERS line {line}: owner {token!r} is not written @login"
    if "/" in token:
        return None, f"CODEOWNERS line {line}: team owners ({token}) are not supported: name people as @login"
    return token[1:].lower(), None


def parse(text: str, where: str = "CODEOWNERS") -> CodeOwners:
    rules: list[Rule] = []
    errors: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        if len(rules) >= MAX_RULES:
            errors.append(f"CODEOWNERS line {number}: more than {MAX_RULES} rules: merge patterns")
            break
        pattern, *tokens = line.split()
        if pattern.startswith("!"):
            errors.append(f"CODEOWNERS line {number}: negation ({pattern}) is not supported")
            continue
        try:
            compiled = GitIgnoreSpec.from_lines([pattern])
        except ValueError:  # pathspec's GitIgnorePatternError
            errors.append(f"CODEOWNERS line {number}: {pattern!r} is not a valid pattern")
            continue
        owners: list[str] = []
        for token in tokens:
            login, error = _owner(token, number)
            if error:
                errors.append(error)
            elif login:
                owners.append(login)
        rules.append(Rule(line=number, pattern=compiled, owners=tuple(owners)))
    return CodeOwners(path=where, rules=rules, errors=errors[:MAX_ERRORS])


def read(repo: pygit2.Repository, ref: str) -> CodeOwners:
    """The CODEOWNERS of `ref` (in a `RepoStore` thread): the first of `LOCATIONS` it holds."""
    for where in LOCATIONS:
        try:
            blob = read_blob(repo, ref, where, max_text_bytes=MAX_BYTES)
        except (PathNotFound, NotABlob):
            continue
        if blob.text is None:
            return CodeOwners(path=where, errors=[f"{where} is not a text file of at most 3 MiB"])
        return parse(blob.text, where)
    return CodeOwners(path="")
