"""`pytest.mark.xdist_group` under pytest 9.

pytest-xdist (3.8) sends the tests of one group to one worker by adding `@<group>` to each test's
node id, which it writes to `item._nodeid`. pytest 9 keeps the id in `item._id` and no longer
reads `_nodeid`, so the groups were silently ignored: grouped tests ran on different workers at
once (two builds of the application image into one staging directory broke each other). This
writes the same suffix where pytest 9 keeps the id, in the workers of a `--dist loadgroup` run
only; where the node id has the suffix already, nothing is changed. tests/unit/test_xdist_groups.py
checks that a group's tests run on one worker."""

import pytest
from _pytest.nodeid import coerce_node_id  # pytest's own parser of node ids: the id's type is its


def group_names(item: pytest.Item) -> list[str]:
    names = {str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")}
    return sorted(names)


def apply(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):  # set in the workers of a loadgroup run
        return
    for item in items:
        names = group_names(item)
        if not names:
            continue
        suffix = "@" + "_".join(names)
        if item.nodeid.endswith(suffix):
            continue
        item._id = coerce_node_id(item.nodeid + suffix)
