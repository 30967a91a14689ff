"""Pull requests over REST and on their page, with the real `git` CLI against a served instance:
what a merge records (`merged_at`), the list's author filter, CODEOWNERS at the root and in `docs/`,
a rule that keeps approvals across pushes, comments and review bodies rendered sanitised, a push to
the head while the merge waits for `pre_merge`, heads written `owner:branch` or out of reach, and
the `pull_request.*` notifications a webhook receives."""

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import msgspec
import pytest
from standardwebhooks.webhooks import Webhook

from forge.core.settings import Settings
from forge.db.engine import Database
from tests.support.accounts import LiveServer, run_sync
from tests.support.git import git
from tests.support.policy import PolicyConsumer
from tests.support.pull_team import PullTeam
from tests.support.webhooks import config as webhook_config
from tests.support.webhooks import receiver
from webhooks.core.outbound import Outbound
from webhooks.delivery.deliverer import Deliverer

API = "/api/v1/repos/ana/app"


class Team(PullTeam):
    """ana owns `app`; bob and dora are write collaborators, rita a reader."""

    def __init__(self, server: LiveServer, tmp: Path) -> None:
        writer = ("write", ("repo:write", "reviews:write"))
        super().__init__(server, tmp, {"bob": writer, "dora": writer, "rita": ("read", ("repo:read",))})
        self.bob, self.dora, self.rita = self.tokens["bob"], self.tokens["dora"], self.tokens["rita"]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Loopback webhook and policy consumers; the one that pushes before it answers needs the time.
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1", webhooks_policy_deadline_seconds=10.0)


@pytest.fixture
def team(live_server: LiveServer, tmp_path: Path) -> Team:
    return Team(live_server, tmp_path)


def _when(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp)


def test_merged_at_is_null_until_the_merge_and_then_its_time(team: Team) -> None:
    head = team.commit("feature", "f.txt", "f\n", new=True)
    team.push("feature")
    opened = team.open("feature")
    number = opened["number"]
    assert opened["merged_at"] is None and opened["merged"] is False
    assert team.pull(number, team.rita)["merged_at"] is None
    [listed] = team.call("GET", f"{API}/pulls", team.rita).json()
    assert listed["number"] == number and listed["merged_at"] is None

    before = datetime.now(UTC)
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head})
    assert r.status_code == 200, r.text
    after = datetime.now(UTC)
    merged = team.pull(number, team.rita)
    assert merged["merged"] is True and merged["merged_at"] is not None
    at = _when(merged["merged_at"])
    # the time of the merge (a second either side: the database may keep whole seconds)
    assert before - timedelta(seconds=1) <= at <= after + timedelta(seconds=1)
    assert at == _when(merged["closed_at"]) and at >= _when(merged["created_at"])
    [in_list] = team.call("GET", f"{API}/pulls?state=merged", team.rita).json()
    assert in_list["number"] == number and in_list["merged_at"] == merged["merged_at"]


def test_the_list_filters_by_author(team: Team) -> None:
    for branch in ("by-ana", "by-bob"):
        team.commit(branch, f"{branch}.txt", "x\n", new=True)
        team.push(branch)
        git("checkout", "main", cwd=team.work)
    assert team.open("by-ana")["number"] == 1
    assert team.open("by-bob", token=team.bob)["number"] == 2

    def numbers(query: str) -> list[int]:
        r = team.call("GET", f"{API}/pulls?{query}", team.rita)
        assert r.status_code == 200, r.text
        return [p["number"] for p in r.json()]

    assert numbers("") == [2, 1]
    assert numbers("author=bob") == [2] and numbers("author=ANA") == [1] and numbers("author=nobody") == []
    assert [p["user"]["login"] for p in team.call("GET", f"{API}/pulls?author=bob", team.rita).json()] == ["bob"]
    closed = team.call("PATCH", f"{API}/pulls/2", team.bob, json={"state": "closed"})
    assert closed.status_code == 200, closed.text
    assert numbers("author=bob") == [] and numbers("author=bob&state=closed") == [2]
    assert numbers("author=ana&state=all") == [1]


@pytest.mark.parametrize("where", ["CODEOWNERS", "docs/CODEOWNERS"])
def test_code_owners_are_read_at_the_root_and_in_docs(team: Team, where: str) -> None:
    rule = {"pattern": "main", "require_code_owner_review": True}
    assert team.call("POST", f"{API}/branch-rules", team.ana, json=rule).json()["require_code_owner_review"] is True
    team.commit("main", where, "*.py @bob\n")
    team.push("main")
    head = team.commit("change", "app.py", "x = 1\n", new=True)
    team.push("change")
    number = team.open("change")["number"]

    def unmet() -> list[str]:
        return team.pull(number)["unmet_rules"]  # type: ignore[no-any-return]

    assert unmet() == ["a code owner (@bob) must approve app.py"]
    approve = {"event": "APPROVE", "commit_id": head}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.dora, json=approve).is_success
    assert unmet() == ["a code owner (@bob) must approve app.py"]  # dora writes here, but owns nothing
    refused = team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"sha": head})
    assert refused.status_code == 409 and refused.json()["code"] == "branch_rule_unmet", refused.text
    assert refused.json()["unmet_rules"] == ["a code owner (@bob) must approve app.py"]
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=approve).is_success
    assert unmet() == []
    assert team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"sha": head}).status_code == 200


def test_approvals_survive_a_push_unless_the_rule_dismisses_them(team: Team) -> None:
    git("checkout", "-b", "release", cwd=team.work)
    team.push("release")
    keep = {"pattern": "main", "required_approvals": 1, "dismiss_stale_approvals": False}
    made = team.call("POST", f"{API}/branch-rules", team.ana, json=keep)
    assert made.status_code == 201 and made.json()["dismiss_stale_approvals"] is False, made.text
    drop = {"pattern": "release", "required_approvals": 1, "dismiss_stale_approvals": True}
    assert team.call("POST", f"{API}/branch-rules", team.ana, json=drop).json()["dismiss_stale_approvals"] is True
    pulls: dict[str, int] = {}
    for base in ("main", "release"):
        git("checkout", base, cwd=team.work)
        head = team.commit(f"to-{base}", f"{base}.txt", "1\n", new=True)
        team.push(f"to-{base}")
        pulls[base] = team.open(f"to-{base}", base)["number"]
        approve = {"event": "APPROVE", "commit_id": head}
        assert team.call("POST", f"{API}/pulls/{pulls[base]}/reviews", team.bob, json=approve).is_success
        assert team.pull(pulls[base])["unmet_rules"] == []
        team.commit(f"to-{base}", f"{base}.txt", "2\n")  # ana pushes again after bob approved
        team.push(f"to-{base}")

    def states(number: int) -> list[str]:
        return [r["state"] for r in team.call("GET", f"{API}/pulls/{number}/reviews", team.ana).json()]

    assert states(pulls["main"]) == ["APPROVED"] and team.pull(pulls["main"])["unmet_rules"] == []
    assert states(pulls["release"]) == ["DISMISSED"]
    assert team.pull(pulls["release"])["unmet_rules"] == ["1 approval(s) required by the rules of release, 0 given"]
    new_head = team.pull(pulls["main"])["head"]["sha"]
    merged = team.call("PUT", f"{API}/pulls/{pulls['main']}/merge", team.ana, json={"sha": new_head})
    assert merged.status_code == 200, merged.text
    refused = team.call("PUT", f"{API}/pulls/{pulls['release']}/merge", team.ana, json={})
    assert refused.status_code == 409 and refused.json()["code"] == "branch_rule_unmet"


class _Page(HTMLParser):
    """Every element of a page with the ids of the elements around it, the text inside each
    element with an id, and the content of each script."""

    VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"})

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.open: list[tuple[str, str | None]] = []
        self.elements: list[tuple[str, dict[str, str], tuple[str, ...]]] = []
        self.text: dict[str, str] = defaultdict(str)
        self.scripts: list[str] = []
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, raw: list[tuple[str, str | None]]) -> None:
        attrs = {k: v or "" for k, v in raw}
        ids = tuple(i for _, i in self.open if i) + ((attrs["id"],) if "id" in attrs else ())
        self.elements.append((tag, attrs, ids))
        if tag not in self.VOID:
            self.open.append((tag, attrs.get("id")))

    def handle_endtag(self, tag: str) -> None:
        while self.open and self.open.pop()[0] != tag:
            pass

    def handle_data(self, data: str) -> None:
        for _, element_id in self.open:
            if element_id:
                self.text[element_id] += data
        if self.open and self.open[-1][0] == "script":
            self.scripts.append(data)


def _hostile(what: str) -> str:
    return (
        f"Keep **{what}**.\n\n<script>alert('pwned by {what}')</script>\n\n"
        f'<img src="https://elsewhere.example/{what}.png" onerror="alert(\'pwned by {what}\')">\n\n'
        f"Also ![pixel](https://elsewhere.example/{what}-pixel.png)\n"
    )


def test_comments_and_review_bodies_are_rendered_sanitised_on_the_page(team: Team) -> None:
    head = team.commit("feature", "f.txt", "f\n", new=True)
    team.push("feature")
    number = team.open("feature")["number"]
    comment = team.call("POST", f"{API}/pulls/{number}/comments", team.bob, json={"body": _hostile("comment")})
    assert comment.status_code == 201, comment.text
    review = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob,
                       json={"event": "COMMENT", "commit_id": head, "body": _hostile("review")})  # fmt: skip
    assert review.status_code == 200, review.text
    assert "<script>" in comment.json()["body"]  # the text is kept as written; the page renders it safely

    r = team.call("GET", f"/ana/app/pull/{number}", team.rita)
    assert r.status_code == 200, r.text
    page = _Page(r.text)
    for what, article in (("comment", f"comment-{comment.json()['id']}"), ("review", f"review-{review.json()['id']}")):
        assert f"Keep {what}." in " ".join(page.text[article].split()), (article, page.text[article])
        inside = [(tag, attrs) for tag, attrs, ids in page.elements if article in ids and attrs.get("id") != article]
        assert ("strong", {}) in inside  # the markdown was rendered, not shown as source
        assert not [tag for tag, _ in inside if tag in ("script", "iframe", "object", "embed")], inside
        assert not [a for tag, a in inside if tag == "img" and "src" in a], inside  # the images of elsewhere: no source
    # nowhere on the page as a live element: no such script, no image of elsewhere, no handler
    assert not [s for s in page.scripts if "pwned" in s]
    assert not [a for tag, a, _ in page.elements if tag == "img" and "elsewhere.example" in a.get("src", "")]
    assert not [a for _, a, _ in page.elements if any(k.startswith("on") and "pwned" in v for k, v in a.items())]


class _PushingConsumer(PolicyConsumer):
    """A policy endpoint that, asked `pre_merge`, first pushes a commit to the pull request's head
    from another clone, then allows the merge."""

    def __init__(self, clone: Path) -> None:
        self.clone = clone
        self.pushed: list[str] = []
        super().__init__()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        if body["type"] == "pre_merge" and not self.pushed:
            (self.clone / "late.txt").write_text("late\n")
            git("add", ".", cwd=self.clone)
            git("commit", "-m", "late", cwd=self.clone)
            git("push", "origin", "feature", cwd=self.clone)
            self.pushed.append(git("rev-parse", "HEAD", cwd=self.clone).stdout.strip())
        return 200, None  # allow


def test_a_push_to_the_head_while_pre_merge_is_asked_is_never_merged(team: Team, tmp_path: Path) -> None:
    checked = team.commit("feature", "f.txt", "f\n", new=True)
    team.push("feature")
    main_before = team.branches()["main"]
    number = team.open("feature")["number"]
    clone = tmp_path / "bob-work"
    git("clone", team.clone_url(team.bob), str(clone), cwd=tmp_path)
    git("checkout", "feature", cwd=clone)
    consumer = _PushingConsumer(clone)
    hook = {"url": consumer.url, "kind": "policy", "events": ["pre_merge"]}
    assert team.call("POST", f"{API}/hooks", team.ana, json=hook).status_code == 201

    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": checked})
    assert r.status_code == 409 and r.json()["code"] == "head_moved", r.text
    [late] = consumer.pushed
    [asked] = [b for b in consumer.seen if b["type"] == "pre_merge"]
    assert asked["data"]["head_sha"] == checked  # the push landed while this question was open
    branches = team.branches()
    assert branches["feature"] == late and branches["main"] == main_before  # nothing was merged
    git("fetch", "origin", cwd=team.work)
    contained = git("merge-base", "--is-ancestor", late, "origin/main", cwd=team.work, check=False)
    assert contained.returncode == 1, contained
    pull = team.pull(number)
    assert pull["state"] == "open" and pull["merged"] is False and pull["head"]["sha"] == late

    # read again, the new head merges, with the late commit
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": late})
    assert r.status_code == 200, r.text
    git("fetch", "origin", cwd=team.work)
    assert git("merge-base", "--is-ancestor", late, "origin/main", cwd=team.work, check=False).returncode == 0


def test_a_head_the_opener_cannot_read_is_404_and_another_repositorys_is_422(team: Team) -> None:
    team.commit("topic", "t.txt", "t\n", new=True)
    team.push("topic")
    olga = team.token("olga", "repo:write")
    made = team.call("POST", "/api/v1/user/repos", olga, json={"name": "app", "auto_init": True})
    assert made.status_code == 201, made.text
    assert team.call("GET", "/api/v1/repos/olga/app", team.ana).status_code == 404  # private: ana cannot read it

    # an outsider of ana/app is told nothing exists, whatever the head
    for head in ("topic", "ana:topic", "olga:main"):
        r = team.call("POST", f"{API}/pulls", olga, json={"title": "x", "head": head, "base": "main"})
        assert r.status_code == 404 and r.json()["code"] == "repo_not_found", (head, r.text)

    # GitHub's `owner:branch` naming this repository's owner is the branch itself
    opened = team.open("ana:topic")
    assert opened["head"]["ref"] == "topic" and opened["head"]["label"] == "ana:topic"
    dup = team.call("POST", f"{API}/pulls", team.bob, json={"title": "again", "head": "ANA:topic", "base": "main"})
    assert dup.status_code == 409 and dup.json()["code"] == "pull_request_exists", dup.text
    assert dup.json()["number"] == opened["number"]

    # another owner's repository that ana cannot read: the 404 of a repository that does not exist
    hidden = team.call("POST", f"{API}/pulls", team.ana, json={"title": "x", "head": "olga:main", "base": "main"})
    missing = team.call("POST", f"{API}/pulls", team.ana, json={"title": "x", "head": "ghost:main", "base": "main"})
    for r in (hidden, missing):
        assert r.status_code == 404 and r.json()["code"] == "repo_not_found", r.text
    assert hidden.json()["detail"] == missing.json()["detail"] and "olga" not in hidden.text

    # one ana can read: refused, saying what to do instead
    assert team.call("PUT", "/api/v1/repos/olga/app/collaborators/ana", olga, json={"role": "read"}).is_success
    r = team.call("POST", f"{API}/pulls", team.ana, json={"title": "x", "head": "olga:main", "base": "main"})
    assert r.status_code == 422 and r.json()["code"] == "invalid_pull_branches", r.text
    detail = r.json()["detail"]
    assert "olga/app" in detail and "cross-repository pull requests are not supported" in detail
    assert "push the branch to ana/app" in detail
    assert [p["number"] for p in team.call("GET", f"{API}/pulls?state=all", team.ana).json()] == [opened["number"]]


async def _deliver_due(settings: Settings) -> None:
    """Deliver every due notification, as the instance's delivery loop does (the served test
    instance runs none): a row waits for the older rows of its repository, so each round sends the
    next one in order."""
    db = Database(settings.effective_database_url)
    cfg = webhook_config(settings)
    out = Outbound(cfg.allow)
    try:
        deliverer = Deliverer(db, cfg, out)
        while await deliverer.run_once():
            pass
    finally:
        await out.aclose()
        await db.dispose()


def test_each_change_of_a_pull_request_is_delivered_to_a_webhook_in_order(team: Team) -> None:
    events = ["opened", "synchronized", "closed", "reopened", "merged"]
    with receiver() as consumer:
        hook = {"url": consumer.url, "kind": "notify", "events": [f"pull_request.{e}" for e in events]}
        made = team.call("POST", f"{API}/hooks", team.ana, json=hook)
        assert made.status_code == 201, made.text
        first = team.commit("feature", "f.txt", "1\n", new=True)
        team.push("feature")
        number = team.open("feature")["number"]
        second = team.commit("feature", "f.txt", "2\n")
        team.push("feature")
        for state in ("closed", "open"):
            r = team.call("PATCH", f"{API}/pulls/{number}", team.ana, json={"state": state})
            assert r.status_code == 200, r.text
        merged = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": second})
        assert merged.status_code == 200, merged.text
        run_sync(_deliver_due(team.server.settings))
    bodies = []
    for seen in consumer.seen:
        Webhook(made.json()["secret"]).verify(seen.body, seen.headers)  # signed with the hook's secret
        bodies.append(json.loads(seen.body))
    assert [(b["type"], b["data"]["number"]) for b in bodies] == [(f"pull_request.{e}", number) for e in events]
    opened, synchronized, closed, reopened, done = bodies
    assert opened["data"]["head"] == {"ref": "feature", "sha": first} and opened["meta"]["actor"]["login"] == "ana"
    assert synchronized["data"]["before"] == first and synchronized["data"]["head"]["sha"] == second
    assert (closed["data"]["state"], reopened["data"]["state"]) == ("closed", "open")
    assert done["data"]["merge_commit_sha"] == merged.json()["sha"] and done["meta"]["actor"]["login"] == "bob"
    assert len({s.headers["webhook-id"] for s in consumer.seen}) == len(events)
