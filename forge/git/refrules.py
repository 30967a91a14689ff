"""Push rules: which ref updates a pusher may make. Pure functions, no I/O.

The same checks run twice: in the server before ``git receive-pack`` starts (everything but the
fast-forward test when the new commit is not in the repository yet) and, authoritatively, in the
``pre-receive`` hook once the pushed objects sit in git's quarantine (see ``hooks``).
"""

from __future__ import annotations

import fnmatch
from typing import Literal

import msgspec

from forge.git.names import confusing_ref_name, is_valid_ref_name

ZERO_SHAS = frozenset({"0" * 40, "0" * 64})

RefusalCode = Literal[
    "archived",
    "invalid_ref",
    "namespace",
    "reserved",
    "protected_deletion",
    "protected_force_push",
    "pull_request_required",
]


class RefUpdate(msgspec.Struct, frozen=True):
    """One command of a push: move ``ref`` from ``old`` to ``new`` (zeros: absent)."""

    old: str
    new: str
    ref: str

    @property
    def is_create(self) -> bool:
        return self.old in ZERO_SHAS

    @property
    def is_delete(self) -> bool:
        return self.new in ZERO_SHAS


class ProtectionRule(msgspec.Struct, frozen=True, kw_only=True):
    """A branch protection rule.

    ``pattern`` is an ``fnmatch`` pattern matched against the branch name (``main``,
    ``release/*``; ``*`` also matches ``/``), or, when it starts with ``refs/``, against the full
    ref name (``refs/tags/v*`` protects tags).
    """

    pattern: str
    allow_force_push: bool = False
    allow_deletion: bool = False
    #: Updates arrive through pull requests only: a direct push that moves the branch is refused.
    require_pull_request: bool = False


class PushContext(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the rules need to know about one push, computed by the server per request."""

    #: The pusher is an admin of the repository.
    is_admin: bool = False
    #: The push is made by forgehand itself (task branches).
    is_internal: bool = False
    archived: bool = False
    default_branch: str | None = None
    #: The default branch gets "no force-push, no deletion" unless a rule says otherwise.
    protect_default_branch: bool = True
    rules: list[ProtectionRule] = []
    #: Protection also binds repository admins (they can still edit the rules).
    admins_bypass_protection: bool = False
    #: Refs below these prefixes, and the prefixes themselves without the slash, are forgehand's.
    reserved_prefixes: list[str] = msgspec.field(default_factory=lambda: ["refs/heads/agent/"])
    #: Namespaces a client may push to at all.
    allowed_namespaces: list[str] = msgspec.field(default_factory=lambda: ["refs/heads/", "refs/tags/"])
    #: For messages and logs only.
    pusher: str | None = None
    #: The repository's page (``https://host/owner/name``): a push to a branch answers with the
    #: link that opens a pull request, or to the open one (``open_pulls``: branch -> number).
    web_url: str | None = None
    open_pulls: dict[str, int] = {}


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    ref: str
    code: RefusalCode
    reason: str


class Protection(msgspec.Struct, frozen=True, kw_only=True):
    allow_force_push: bool
    allow_deletion: bool
    #: The pattern of a matching rule that requires pull requests (None: none does).
    pull_request_rule: str | None = None


def branch_name(ref: str) -> str | None:
    return ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None


def pattern_matches(pattern: str, ref: str) -> bool:
    """A rule's pattern against a full ref: the branch name, or the full ref for ``refs/`` patterns."""
    subject = ref if pattern.startswith("refs/") else branch_name(ref)
    return subject is not None and fnmatch.fnmatchcase(subject, pattern)


def protection_for(ref: str, ctx: PushContext) -> Protection | None:
    """The combined protection of ``ref`` (the strictest of the matching rules), or ``None``."""
    branch = branch_name(ref)
    matched = [rule for rule in ctx.rules if pattern_matches(rule.pattern, ref)]
    if not matched:
        if ctx.protect_default_branch and branch is not None and branch == ctx.default_branch:
            return Protection(allow_force_push=False, allow_deletion=False)
        return None
    return Protection(
        allow_force_push=all(r.allow_force_push for r in matched),
        allow_deletion=all(r.allow_deletion for r in matched),
        pull_request_rule=next((r.pattern for r in matched if r.require_pull_request), None),
    )


def _reserved_prefix(ref: str, ctx: PushContext) -> str | None:
    """The reserved prefix ``ref`` falls under, in any case (``Agent/x`` is as reserved as
    ``agent/x``: on a case-insensitive client the two are one ref)."""
    folded = ref.casefold()
    for prefix in ctx.reserved_prefixes:
        p = prefix.casefold()
        if folded.startswith(p) or folded == p.rstrip("/"):
            return prefix
    return None


def needs_fast_forward_check(update: RefUpdate, ctx: PushContext) -> bool:
    """Whether ``check_ref_update`` needs to know if ``update`` is a fast-forward."""
    if update.is_create or update.is_delete:
        return False
    protection = protection_for(update.ref, ctx)
    if protection is None or protection.allow_force_push:
        return False
    return not (ctx.is_admin and ctx.admins_bypass_protection)


def check_ref_update(update: RefUpdate, ctx: PushContext, *, fast_forward: bool | None = None) -> Refusal | None:
    """The refusal for ``update``, or ``None`` if it is allowed.

    ``fast_forward`` says whether ``new`` descends from ``old``; ``None`` (unknown, the new
    objects have not arrived yet) skips the force-push check: the pre-receive hook makes it.
    """
    ref = update.ref

    def refuse(code: RefusalCode, reason: str) -> Refusal:
        return Refusal(ref=ref, code=code, reason=reason)

    if ctx.archived:
        return refuse("archived", "repository is archived (read-only)")
    if not is_valid_ref_name(ref):
        return refuse("invalid_ref", "invalid ref name")
    if not ref.startswith(tuple(ctx.allowed_namespaces)):
        return refuse("namespace", "only branches and tags can be pushed")
    confusing = confusing_ref_name(ref)
    if confusing is not None:
        return refuse("invalid_ref", confusing)
    prefix = _reserved_prefix(ref, ctx)
    if prefix is not None and not (ctx.is_internal or ctx.is_admin):
        shown = prefix.removeprefix("refs/heads/")
        return refuse("reserved", f"{shown}* branches are reserved for forgehand tasks")
    protection = protection_for(ref, ctx)
    if protection is None or (ctx.is_admin and ctx.admins_bypass_protection):
        return None
    kind = "branch" if ref.startswith("refs/heads/") else "tag" if ref.startswith("refs/tags/") else "ref"
    if update.is_delete and not protection.allow_deletion:
        return refuse("protected_deletion", f"protected {kind}: deletion refused")
    if protection.pull_request_rule is not None and not (update.is_create or update.is_delete or ctx.is_internal):
        branch = branch_name(ref) or ref
        return refuse(
            "pull_request_required",
            f"{branch} takes changes through pull requests (branch rule {protection.pull_request_rule!r}): "
            f"push to another branch and open a pull request",
        )
    if not update.is_create and not update.is_delete and fast_forward is False and not protection.allow_force_push:
        return refuse("protected_force_push", f"protected {kind}: force-push refused")
    return None


def check_push(
    updates: list[RefUpdate],
    ctx: PushContext,
    fast_forwards: dict[str, bool | None] | None = None,
) -> list[Refusal]:
    """Every refusal of a push (``fast_forwards`` by ref name, as for ``check_ref_update``)."""
    refusals: list[Refusal] = []
    for update in updates:
        ff = (fast_forwards or {}).get(update.ref)
        refusal = check_ref_update(update, ctx, fast_forward=ff)
        if refusal is not None:
            refusals.append(refusal)
    return refusals


_context_decoder = msgspec.json.Decoder(PushContext)
_context_encoder = msgspec.json.Encoder()


def encode_context(ctx: PushContext) -> str:
    return _context_encoder.encode(ctx).decode()


def decode_context(data: str | bytes) -> PushContext:
    return _context_decoder.decode(data)
