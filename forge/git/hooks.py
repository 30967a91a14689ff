"""The server-owned ``pre-receive`` and ``post-receive`` hooks.

``install_hooks(dir)`` writes them once at start-up into a directory outside every repository;
each receive-pack runs with ``-c core.hooksPath=<dir>`` (see ``smart_http``), so nothing in a
repository, and nothing a push carries, can change which hooks run.

The server passes, through the git process environment:

* ``FORGEHAND_PUSH_CONTEXT``: the JSON of ``refrules.PushContext`` for this push (without it,
  the pre-receive hook refuses everything: fail closed);
* ``FORGEHAND_PUSH_LOG`` (optional): a file where post-receive appends the accepted updates as
  JSON lines ``{"old": ..., "new": ..., "ref": ...}``.

pre-receive runs once the pack is received, indexed and checked, while its objects are still in
git's quarantine: it re-checks every rule, and the fast-forward test can now see the new commits
(``git merge-base --is-ancestor``). If it refuses, git deletes the quarantine: the repository is
untouched, and the client prints our reasons as ``remote: ...`` lines. post-receive answers each
branch push with the link that opens a pull request, or to the open one (``pull_request_links``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import msgspec

from forge.git.refrules import (
    PushContext,
    RefUpdate,
    check_ref_update,
    decode_context,
    needs_fast_forward_check,
)

ENV_CONTEXT = "FORGEHAND_PUSH_CONTEXT"
ENV_PUSH_LOG = "FORGEHAND_PUSH_LOG"
HOOK_NAMES = ("pre-receive", "post-receive")
_RUNNER = "_forgehand_hook.py"


def _package_root() -> Path:
    """The directory that contains the ``forge`` package."""
    return Path(__file__).resolve().parent.parent.parent


def install_hooks(hooks_dir: Path, *, python: str | None = None) -> Path:
    """Write the hooks into ``hooks_dir`` (created if needed); returns ``hooks_dir``.

    Idempotent: each file is written to a temporary name and renamed over the old one.
    """
    hooks_dir = Path(hooks_dir).resolve()
    hooks_dir.mkdir(parents=True, exist_ok=True)
    interpreter = python or sys.executable
    runner = hooks_dir / _RUNNER
    _write(
        runner,
        "# Written by forgehand (forge.git.hooks.install_hooks). Do not edit.\n"
        "import sys\n"
        f"sys.path.insert(0, {str(_package_root())!r})\n"
        "from forge.git.hooks import main\n"
        "sys.exit(main(sys.argv[1:]))\n",
        0o644,
    )
    for name in HOOK_NAMES:
        _write(
            hooks_dir / name,
            "#!/bin/sh\n"
            "# Written by forgehand (forge.git.hooks.install_hooks). Do not edit.\n"
            f"exec {shlex.quote(interpreter)} -I {shlex.quote(str(runner))} {name}\n",
            0o755,
        )
    return hooks_dir


def _write(path: Path, content: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(content)
    tmp.chmod(mode)
    tmp.replace(path)


def _read_updates(data: bytes) -> list[RefUpdate]:
    updates = []
    for line in data.decode("utf-8", "replace").splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3:
            updates.append(RefUpdate(old=parts[0], new=parts[1], ref=parts[2]))
    return updates


def is_ancestor(old: str, new: str) -> bool:
    """Whether ``new`` descends from ``old``, seen from inside the hook (quarantine included)."""
    proc = subprocess.run(
        ["git", "merge-base", "--is-ancestor", old, new],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
    return proc.returncode == 0


def pre_receive(stdin: bytes, environ: dict[str, str]) -> tuple[int, list[str]]:
    """Decide a push; returns (exit code, messages for the client)."""
    raw = environ.get(ENV_CONTEXT)
    if not raw:
        return 1, ["forgehand: this push did not come through forgehand: refused"]
    try:
        ctx = decode_context(raw)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return 1, ["forgehand: invalid push context: refused"]
    messages = []
    for update in _read_updates(stdin):
        ff = is_ancestor(update.old, update.new) if needs_fast_forward_check(update, ctx) else None
        refusal = check_ref_update(update, ctx, fast_forward=ff)
        if refusal is not None:
            messages.append(f"forgehand: refusing {refusal.ref}: {refusal.reason}")
    if messages:
        messages.append("forgehand: push refused, nothing was changed")
        return 1, messages
    return 0, []


def pull_request_links(updates: list[RefUpdate], ctx: PushContext) -> list[str]:
    """What a push answers about pull requests, as Gitea does: for each branch it created or
    moved (not the default branch), the link to open a pull request, or to the open one."""
    if not ctx.web_url or ctx.is_internal:
        return []
    lines: list[str] = []
    for update in updates:
        branch = update.ref.removeprefix("refs/heads/")
        if branch == update.ref or update.is_delete or branch == ctx.default_branch:
            continue
        number = ctx.open_pulls.get(branch)
        if number is not None:
            lines += ["Visit the existing pull request:", f"  {ctx.web_url}/pull/{number}"]
        else:
            base = quote(ctx.default_branch or "main", safe="/")
            lines += [
                f"Create a pull request for '{branch}':",
                f"  {ctx.web_url}/compare/{base}...{quote(branch, safe='/')}",
            ]
    return ["", *lines, ""] if lines else []


def post_receive(stdin: bytes, environ: dict[str, str]) -> int:
    updates = _read_updates(stdin)
    raw = environ.get(ENV_CONTEXT)
    if raw:
        with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
            for line in pull_request_links(updates, decode_context(raw)):
                print(line, file=sys.stderr)
    log = environ.get(ENV_PUSH_LOG)
    if not log:
        return 0
    encoder = msgspec.json.Encoder()
    try:
        with Path(log).open("ab") as fh:
            for update in updates:
                fh.write(encoder.encode({"old": update.old, "new": update.new, "ref": update.ref}) + b"\n")
            fh.flush()
            os.fsync(fh.fileno())  # the push journal reads it after a crash
    except OSError as exc:
        # The refs have moved already; the journal falls back to reading them. One line, no traceback.
        print(f"forgehand: the push landed but its log could not be written: {exc}", file=sys.stderr)
    return 0


def main(argv: list[str]) -> int:
    hook = argv[0] if argv else ""
    stdin = sys.stdin.buffer.read()
    environ = dict(os.environ)
    if hook == "pre-receive":
        code, messages = pre_receive(stdin, environ)
        for message in messages:
            print(message, file=sys.stderr)
        sys.stderr.flush()
        return code
    if hook == "post-receive":
        return post_receive(stdin, environ)
    print(f"forgehand: unknown hook {hook!r}", file=sys.stderr)
    return 1
