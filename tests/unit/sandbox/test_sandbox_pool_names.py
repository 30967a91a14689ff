"""Pooled containers carry their task and run in their name, losslessly."""

from sandbox.pool import LABEL_POOL, assigned_name, parse_assigned_name, pool_identity


def test_roundtrip() -> None:
    for task, run in [("t1", "r1"), ("task-with-r-inside", "run:with@odd+chars"), ("a-t-b", "c-r-d")]:
        name = assigned_name("abc123", task, run)
        assert parse_assigned_name(name) == (task, run)


def test_other_names_are_not_pooled() -> None:
    assert parse_assigned_name("forgehand-inst-run-abc") is None
    assert parse_assigned_name("forgehand-pool-abc123") is None
    assert parse_assigned_name("forgehand-pool-x-t-zz-r-00") is None


def test_identity_needs_the_pool_label() -> None:
    name = assigned_name("abc", "t", "r")
    assert pool_identity({}, name) is None
    assert pool_identity({LABEL_POOL: "p1"}, name) == ("t", "r")
    assert pool_identity({LABEL_POOL: "p1", "forgehand.task": "pool"}, "forgehand-pool-abc") == ("pool", "pool:p1")
