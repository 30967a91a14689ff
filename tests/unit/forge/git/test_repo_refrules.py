import pytest
from hypothesis import given
from hypothesis import strategies as st

from forge.git.refrules import (
    ProtectionRule,
    PushContext,
    RefUpdate,
    check_push,
    check_ref_update,
    decode_context,
    encode_context,
    needs_fast_forward_check,
    protection_for,
)

Z = "0" * 40
A = "a" * 40
B = "b" * 40

CTX = PushContext(default_branch="main")


def update(ref: str, old: str = A, new: str = B) -> RefUpdate:
    return RefUpdate(old=old, new=new, ref=ref)


def code(u: RefUpdate, ctx: PushContext = CTX, ff: bool | None = None) -> str | None:
    refusal = check_ref_update(u, ctx, fast_forward=ff)
    return refusal.code if refusal is not None else None


def test_fast_forward_to_default_branch_is_allowed() -> None:
    assert code(update("refs/heads/main"), ff=True) is None


def test_force_push_to_default_branch_is_refused() -> None:
    refusal = check_ref_update(update("refs/heads/main"), CTX, fast_forward=False)
    assert refusal is not None
    assert refusal.code == "protected_force_push"
    assert refusal.reason == "protected branch: force-push refused"


def test_unknown_fast_forward_is_left_to_the_hook() -> None:
    assert code(update("refs/heads/main"), ff=None) is None
    assert needs_fast_forward_check(update("refs/heads/main"), CTX)
    assert not needs_fast_forward_check(update("refs/heads/topic"), CTX)
    assert not needs_fast_forward_check(update("refs/heads/main", old=Z), CTX)
    assert not needs_fast_forward_check(update("refs/heads/main", new=Z), CTX)


def test_deleting_the_default_branch_is_refused_even_for_admins() -> None:
    assert code(update("refs/heads/main", new=Z)) == "protected_deletion"
    admin = PushContext(default_branch="main", is_admin=True)
    assert code(update("refs/heads/main", new=Z), admin) == "protected_deletion"


def test_admins_may_bypass_when_configured() -> None:
    ctx = PushContext(default_branch="main", is_admin=True, admins_bypass_protection=True)
    assert code(update("refs/heads/main", new=Z), ctx) is None
    assert not needs_fast_forward_check(update("refs/heads/main"), ctx)


def test_other_branches_are_free() -> None:
    assert code(update("refs/heads/topic"), ff=False) is None
    assert code(update("refs/heads/topic", new=Z)) is None
    assert code(update("refs/heads/new", old=Z)) is None


def test_default_branch_protection_can_be_switched_off() -> None:
    ctx = PushContext(default_branch="main", protect_default_branch=False)
    assert code(update("refs/heads/main", new=Z), ctx) is None


def test_pattern_rules() -> None:
    ctx = PushContext(
        default_branch="main",
        rules=[
            ProtectionRule(pattern="release/*"),
            ProtectionRule(pattern="main", allow_force_push=True),
            ProtectionRule(pattern="refs/tags/v*", allow_deletion=False),
        ],
    )
    assert code(update("refs/heads/release/1.0"), ctx, ff=False) == "protected_force_push"
    assert code(update("refs/heads/release/1.0", new=Z), ctx) == "protected_deletion"
    # an explicit rule for the default branch replaces the implicit one
    assert code(update("refs/heads/main"), ctx, ff=False) is None
    assert code(update("refs/heads/main", new=Z), ctx) == "protected_deletion"
    refusal = check_ref_update(update("refs/tags/v1", new=Z), ctx)
    assert refusal is not None and refusal.reason == "protected tag: deletion refused"
    assert code(update("refs/tags/x", new=Z), ctx) is None


def test_strictest_matching_rule_wins() -> None:
    ctx = PushContext(rules=[ProtectionRule(pattern="*", allow_force_push=True), ProtectionRule(pattern="prod")])
    assert code(update("refs/heads/prod"), ctx, ff=False) == "protected_force_push"
    assert code(update("refs/heads/dev"), ctx, ff=False) is None
    protection = protection_for("refs/heads/dev", ctx)
    assert protection is not None and protection.allow_force_push and not protection.allow_deletion


@pytest.mark.parametrize("ref", ["refs/heads/agent/task-1", "refs/heads/agent", "refs/heads/agent/x/y"])
def test_agent_branches_are_reserved(ref: str) -> None:
    assert code(update(ref, old=Z)) == "reserved"
    assert code(update(ref, old=Z), PushContext(is_admin=True)) is None
    assert code(update(ref, old=Z), PushContext(is_internal=True)) is None


def test_agent_reason_is_clear() -> None:
    refusal = check_ref_update(update("refs/heads/agent/t1", old=Z), CTX)
    assert refusal is not None and refusal.reason == "agent/* branches are reserved for forgehand tasks"


def test_agents_prefix_is_not_reserved() -> None:
    assert code(update("refs/heads/agents", old=Z)) is None
    assert code(update("refs/heads/agentx/1", old=Z)) is None


def test_archived_refuses_everything() -> None:
    ctx = PushContext(archived=True, is_admin=True, is_internal=True)
    assert code(update("refs/heads/topic"), ctx, ff=True) == "archived"


@pytest.mark.parametrize(
    "ref", ["refs/pull/1/head", "refs/remotes/origin/main", "refs/forgehand/x", "refs/notes/commits"]
)
def test_other_namespaces_are_refused(ref: str) -> None:
    assert code(update(ref)) == "namespace"


@pytest.mark.parametrize("ref", ["HEAD", "refs/heads/a..b", "refs/heads/x.lock", "main"])
def test_invalid_refs_are_refused(ref: str) -> None:
    assert code(update(ref)) == "invalid_ref"


def test_check_push_collects_every_refusal() -> None:
    updates = [update("refs/heads/main", new=Z), update("refs/heads/ok"), update("refs/heads/agent/x", old=Z)]
    refusals = check_push(updates, CTX)
    assert [r.ref for r in refusals] == ["refs/heads/main", "refs/heads/agent/x"]
    refusals = check_push([update("refs/heads/main")], CTX, {"refs/heads/main": False})
    assert [r.code for r in refusals] == ["protected_force_push"]


def test_context_round_trips_through_json() -> None:
    ctx = PushContext(
        is_admin=True, default_branch="trunk", rules=[ProtectionRule(pattern="rel/*", allow_deletion=True)]
    )
    assert decode_context(encode_context(ctx)) == ctx


def test_sha256_zero_ids() -> None:
    z = "0" * 64
    u = RefUpdate(old="a" * 64, new=z, ref="refs/heads/main")
    assert u.is_delete and code(u) == "protected_deletion"


def _case_variants(word: str) -> st.SearchStrategy[str]:
    return st.tuples(*[st.sampled_from(sorted({c.lower(), c.upper()})) for c in word]).map("".join)


_suffix = st.text(alphabet="abcxyz019-_", min_size=1, max_size=12).filter(lambda s: not s.startswith("-"))


@given(prefix=_case_variants("agent"), rest=_suffix)
def test_reserved_prefixes_are_reserved_in_any_case(prefix: str, rest: str) -> None:
    ref = f"refs/heads/{prefix}/{rest}"
    assert code(update(ref, old=Z)) == "reserved"
    assert code(update(ref, old=Z), PushContext(default_branch="main", is_internal=True)) is None


@given(head=_case_variants("head"), namespace=st.sampled_from(["refs/heads/", "refs/tags/"]))
def test_head_is_never_a_branch_or_tag(head: str, namespace: str) -> None:
    admin = PushContext(default_branch="main", is_admin=True, is_internal=True)
    assert code(update(namespace + head, old=Z)) == "invalid_ref"
    assert code(update(namespace + head, old=Z), admin) == "invalid_ref"


@given(name=_suffix)
def test_option_like_and_ordinary_names(name: str) -> None:
    assert code(update(f"refs/heads/-{name}", old=Z)) == "invalid_ref"
    assert code(update(f"refs/heads/feature/{name}", old=Z)) is None
    assert code(update(f"refs/heads/{name}/HEAD", old=Z)) is None  # a component, not the name
