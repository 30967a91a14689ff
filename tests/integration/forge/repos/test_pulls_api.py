"""Pull requests over REST, as a team and its CI drive them, with the real `git` CLI against a
real server: push a branch (the answer links to a new pull request), open one, review on a line,
push a fix (stale approvals go), approve, a required check, merge; and what is refused."""

import threading
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from forge.core.settings import Settings
from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.git import git
from tests.support.policy import PolicyConsumer
from tests.support.pull_team import PullTeam

API = "/api/v1/repos/ana/app"


class Team(PullTeam):
    """ana owns `app`; bob is a write collaborator, rita a reader; ci a bot with write access."""

    def __init__(self, server: LiveServer, tmp: Path) -> None:
        members = {
            "bob": ("write", ("repo:write", "reviews:write")),
            "rita": ("read", ("repo:read",)),
            "ci": ("write", ("repo:write",)),
        }
        super().__init__(server, tmp, members)
        self.bob, self.rita, self.ci = self.tokens["bob"], self.tokens["rita"], self.tokens["ci"]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # A loopback policy consumer; the one that pushes before it answers gets the longest deadline.
    return msgspec.structs.replace(settings, webhooks_allowed_hosts="127.0.0.1", webhooks_policy_deadline_seconds=10.0)


@pytest.fixture
def team(live_server: LiveServer, tmp_path: Path) -> Team:
    return Team(live_server, tmp_path)


def test_a_feature_is_pushed_opened_reviewed_fixed_checked_and_merged(team: Team) -> None:
    team.call("POST", f"{API}/branch-rules", team.ana, json={
        "pattern": "main", "require_pull_request": True, "required_approvals": 1, "required_checks": ["ci/build"],
    }).raise_for_status()  # fmt: skip
    team.commit("feature/x", "app.py", "def run():\n    return 1\n", new=True)
    answer = team.push("feature/x")
    assert "Create a pull request for 'feature/x':" in answer
    assert f"{team.url}/ana/app/compare/main...feature/x" in answer

    r = team.call("POST", f"{API}/pulls", team.ana, json={
        "title": "Add run()", "head": "feature/x", "base": "main", "body": "First **cut**.",
    })  # fmt: skip
    assert r.status_code == 201, r.text
    pull = r.json()
    number, first_head = pull["number"], pull["head"]["sha"]
    assert pull["state"] == "open" and not pull["merged"] and pull["head"]["ref"] == "feature/x"
    assert pull["base"]["ref"] == "main" and pull["user"]["login"] == "ana"
    assert pull["html_url"] == f"{team.url}/ana/app/pull/{number}"
    assert pull["mergeable"] is True and pull["mergeable_state"] == "blocked"
    assert pull["unmet_rules"] == [
        "1 approval(s) required by the rules of main, 0 given", "required check ci/build has not reported",
    ]  # fmt: skip
    assert (pull["commits"], pull["changed_files"], pull["additions"]) == (1, 1, 2)

    # bob comments on a line and requests changes; rita (read) may read but not review
    review = {"event": "REQUEST_CHANGES", "body": "Return 2.", "commit_id": first_head,
              "comments": [{"path": "app.py", "line": 2, "body": "should be 2"}]}  # fmt: skip
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.rita, json=review).status_code == 403
    r = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=review)
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "CHANGES_REQUESTED"
    lines = team.call("GET", f"{API}/pulls/{number}/comments", team.rita).json()
    assert [(c["path"], c["line"], c["body"], c["outdated"]) for c in lines] == [("app.py", 2, "should be 2", False)]
    assert "changes requested by bob" in team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"]

    # ana pushes the fix: the pull request follows its head, bob's comment is now on an old head
    fixed = team.commit("feature/x", "app.py", "def run():\n    return 2\n")
    answer = team.push("feature/x")  # the answer now points at the open pull request
    assert "Visit the existing pull request:" in answer and f"{team.url}/ana/app/pull/{number}" in answer
    pull = team.call("GET", f"{API}/pulls/{number}", team.ana).json()
    assert pull["head"]["sha"] == fixed and pull["commits"] == 2
    assert team.call("GET", f"{API}/pulls/{number}/comments", team.ana).json()[0]["outdated"] is True

    # an approval of the old head is refused; of the new one it counts and lifts bob's request
    stale = {"event": "APPROVE", "commit_id": first_head}
    r = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=stale)
    assert r.status_code == 409 and r.json()["code"] == "head_moved" and r.json()["head_sha"] == fixed
    ok = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json={"event": "APPROVE", "commit_id": fixed})
    assert ok.status_code == 200 and ok.json()["state"] == "APPROVED"
    refused = team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"strategy": "merge"})
    assert refused.status_code == 409 and refused.json()["code"] == "branch_rule_unmet"
    assert refused.json()["unmet_rules"] == ["required check ci/build has not reported"]

    # CI reports success on the head; the merge lands on main
    status = {"state": "success", "context": "ci/build", "target_url": "https://ci.example/9"}
    assert team.call("POST", f"{API}/statuses/{fixed}", team.ci, json=status).status_code == 201
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["mergeable_state"] == "clean"
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"strategy": "merge", "sha": fixed})
    assert r.status_code == 200, r.text
    merged_sha = r.json()["sha"]
    main = team.call("GET", f"{API}/branches", team.ana).json()
    assert {b["name"]: b["sha"] for b in main}["main"] == merged_sha
    git("fetch", "origin", cwd=team.work)
    log = git("log", "--format=%s|%P", "-1", "origin/main", cwd=team.work).stdout.strip()
    assert log.startswith(f"Merge pull request #{number} from feature/x|") and fixed in log
    final = team.call("GET", f"{API}/pulls/{number}", team.rita).json()
    assert final["state"] == "closed" and final["merged"] and final["merged_by"]["login"] == "ana"
    assert final["merge_commit_sha"] == merged_sha and final["mergeable_state"] == "closed"
    listed = team.call("GET", f"{API}/pulls?state=closed", team.rita).json()
    assert [p["number"] for p in listed] == [number]
    assert team.call("GET", f"{API}/pulls", team.rita).json() == []
    # the conversation tells the pushes to the head, the statuses reported on it and the merge, in order
    page = team.call("GET", f"/ana/app/pull/{number}", team.rita).text
    pushed, checked, merged = (page.index(f"pushed to <code>feature/x</code>: <a href=\"/ana/app/commit/{fixed}\""),
                               page.index("ci/build: success</span> on"), page.index('id="merge-event"'))  # fmt: skip
    assert pushed < checked < merged

    # the rule held for people too: a direct push to main is refused, naming the rule
    git("checkout", "main", cwd=team.work)
    git("merge", "--ff-only", "origin/main", cwd=team.work)
    team.commit("main", "direct.txt", "x\n")
    refusal = git("push", "origin", "main", cwd=team.work, check=False)
    assert refusal.returncode != 0
    assert "main takes changes through pull requests (branch rule 'main')" in refusal.stderr

    admin = run_sync(make_account_with_token(team.server.settings, "root", "admin", admin=True))
    audit = team.call("GET", "/api/v1/admin/audit", admin, params={"limit": 500}).json()
    actions = {a["action"] for a in audit if a["target"] == f"ana/app#{number}"}
    assert actions == {"repo.pull.open", "repo.pull.review", "repo.pull.merge"}


def test_what_is_refused(team: Team) -> None:
    team.commit("topic", "t.txt", "t\n", new=True)
    team.push("topic")
    same = {"title": "x", "head": "main", "base": "main"}
    assert team.call("POST", f"{API}/pulls", team.ana, json=same).json()["code"] == "invalid_pull_branches"
    missing = {"title": "x", "head": "nope", "base": "main"}
    r = team.call("POST", f"{API}/pulls", team.ana, json=missing)
    assert r.status_code == 422 and r.json()["code"] == "invalid_pull_branches" and "nope" in r.json()["detail"]
    nothing = {"title": "x", "head": "main", "base": "topic"}
    assert team.call("POST", f"{API}/pulls", team.ana, json=nothing).json()["code"] == "no_commits_between"
    assert (
        team.call("POST", f"{API}/pulls", team.rita, json={"title": "x", "head": "topic", "base": "main"}).status_code
        == 403
    )
    opened = team.call("POST", f"{API}/pulls", team.ana, json={"title": "T", "head": "topic", "base": "main"})
    number = opened.json()["number"]
    dup = team.call("POST", f"{API}/pulls", team.bob, json={"title": "T2", "head": "topic", "base": "main"})
    assert dup.status_code == 409 and dup.json()["code"] == "pull_request_exists" and dup.json()["number"] == number

    own = team.call("POST", f"{API}/pulls/{number}/reviews", team.ana, json={"event": "APPROVE"})
    assert own.status_code == 422 and own.json()["code"] == "cannot_review_own"
    off = {"event": "COMMENT", "comments": [{"path": "t.txt", "line": 7, "body": "?"}]}
    bad = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=off)
    assert bad.status_code == 422 and bad.json()["code"] == "invalid_review_line"
    assert team.call("GET", f"{API}/pulls/{number}/reviews", team.ana).json() == []  # nothing half-saved
    assert team.call("GET", f"{API}/pulls/999", team.ana).json()["code"] == "pull_not_found"
    assert team.call("GET", f"{API}/pulls/abc", team.ana).status_code == 404
    outsider = team.token("olga", "repo:read")
    assert team.call("GET", f"{API}/pulls", outsider).json()["code"] == "repo_not_found"
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": "0" * 40})
    assert r.status_code == 409 and r.json()["code"] == "head_moved"
    reviewers = team.call("POST", f"{API}/pulls/{number}/requested_reviewers", team.ana, json={"reviewers": ["rita"]})
    assert reviewers.status_code == 422 and reviewers.json()["code"] == "invalid_reviewer"
    asked = team.call("POST", f"{API}/pulls/{number}/requested_reviewers", team.ana, json={"reviewers": ["bob"]})
    assert [u["login"] for u in asked.json()["requested_reviewers"]] == ["bob"]

    # close, reopen, draft: a draft does not merge
    assert team.call("PATCH", f"{API}/pulls/{number}", team.ana, json={"state": "closed"}).json()["state"] == "closed"
    assert team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={}).json()["code"] == "pull_not_open"
    back = team.call("PATCH", f"{API}/pulls/{number}", team.ana, json={"state": "open", "draft": True}).json()
    assert back["state"] == "open" and back["draft"] and back["mergeable_state"] == "draft"
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={})
    assert r.status_code == 409 and "draft" in r.json()["unmet_rules"][0]
    r = team.call("POST", f"{API}/pulls/{number}/merge", team.bob, json={})  # Gitea's method: the same answer
    assert r.status_code == 409 and "draft" in r.json()["unmet_rules"][0]


def test_conflicts_update_branch_and_one_merge_of_two(team: Team) -> None:
    team.commit("feature", "shared.txt", "feature\n", new=True)
    team.push("feature")
    team.commit("main", "shared.txt", "main\n")
    team.push("main")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "F", "head": "feature", "base": "main"}).json()[
        "number"
    ]
    pull = team.call("GET", f"{API}/pulls/{number}", team.bob).json()
    assert pull["mergeable"] is False and pull["mergeable_state"] == "dirty" and pull["conflicts"] == ["shared.txt"]
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={})
    assert r.status_code == 409 and r.json()["code"] == "merge_conflict"
    assert team.call("PUT", f"{API}/pulls/{number}/update-branch", team.ana, json={}).json()["code"] == "merge_conflict"

    # resolved by hand, then main moves on cleanly: Update branch merges main into the head
    git("checkout", "feature", cwd=team.work)
    git("merge", "main", cwd=team.work, check=False)
    (team.work / "shared.txt").write_text("both\n")
    git("commit", "-am", "resolve", cwd=team.work)
    team.push("feature")
    team.commit("main", "other.txt", "o\n")
    team.push("main")
    before = team.call("GET", f"{API}/pulls/{number}", team.ana).json()
    assert before["behind_by"] == 1 and before["mergeable_state"] == "clean"
    updated = team.call("PUT", f"{API}/pulls/{number}/update-branch", team.ana, json={
        "expected_head_sha": before["head"]["sha"]})  # fmt: skip
    assert updated.status_code == 202, updated.text
    assert updated.json()["behind_by"] == 0 and updated.json()["head"]["sha"] != before["head"]["sha"]

    # two merges at once: one merge commit, the other is told
    head = updated.json()["head"]["sha"]
    answers: list[httpx.Response] = []

    def merge() -> None:
        answers.append(team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head}))

    threads = [threading.Thread(target=merge) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    assert {a.json().get("code") for a in answers if a.status_code == 409} <= {"pull_not_open", "base_moved"}
    git("fetch", "origin", cwd=team.work)
    merges = git("log", "--merges", "--format=%s", "origin/main", cwd=team.work).stdout.splitlines()
    assert merges.count(f"Merge pull request #{number} from feature") == 1


class MergeConsumer(PolicyConsumer):
    """A policy endpoint whose answer to `pre_merge` is a callback (it may act before answering)."""

    def __init__(self) -> None:
        self.on_merge: Any = lambda body: None
        super().__init__()

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        return 200, self.on_merge(body) if body["type"] == "pre_merge" else None


def test_pre_merge_governs_a_persons_merge(team: Team, tmp_path: Path) -> None:
    consumer = MergeConsumer()
    hook = {"url": consumer.url, "kind": "policy", "events": ["pre_merge"]}
    assert team.call("POST", f"{API}/hooks", team.ana, json=hook).status_code == 201
    head = team.commit("feature", "f.txt", "f\n", new=True)
    team.push("feature")
    opened = team.call("POST", f"{API}/pulls", team.ana, json={"title": "F", "head": "feature", "base": "main"})
    number = opened.json()["number"]
    other = tmp_path / "other"
    git("clone", team.clone_url(team.bob), str(other), cwd=tmp_path)
    (other / "o.txt").write_text("o\n")
    git("add", ".", cwd=other)
    git("commit", "-m", "o", cwd=other)
    pushed = git("rev-parse", "HEAD", cwd=other).stdout.strip()

    consumer.on_merge = lambda body: git("push", "origin", "main", cwd=other) and None  # moves main meanwhile
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head})
    assert r.status_code == 409 and r.json()["code"] == "base_moved", r.text
    branches = {b["name"]: b["sha"] for b in team.call("GET", f"{API}/branches", team.ana).json()}
    assert branches["main"] == pushed  # the push survived; nothing was merged
    [asked] = [b for b in consumer.seen if b["type"] == "pre_merge"]
    assert asked["meta"]["task"] is None and asked["meta"]["actor"]["login"] == "bob"
    assert asked["data"]["pull_request"]["number"] == number and asked["data"]["head_sha"] == head
    assert asked["data"]["base"] == "main" and asked["data"]["strategy"] == "merge"

    consumer.on_merge = lambda body: {"permission": {"decision": "deny", "reason": "freeze until Monday"}}
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head})
    assert r.status_code == 403 and r.json()["code"] == "policy_denied" and "freeze until Monday" in r.json()["detail"]
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["state"] == "open"

    consumer.on_merge = lambda body: None
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head})
    assert r.status_code == 200, r.text
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["merged"] is True


def test_code_owners_approve_what_they_own_and_a_broken_file_fails_closed(team: Team) -> None:
    dora = team.token("dora", "repo:write", "reviews:write")
    assert team.call("PUT", f"{API}/collaborators/dora", team.ana, json={"role": "write"}).is_success
    rule = {"pattern": "main", "require_code_owner_review": True}
    assert team.call("POST", f"{API}/branch-rules", team.ana, json=rule).json()["require_code_owner_review"] is True
    git("checkout", "main", cwd=team.work)
    (team.work / ".forgehand").mkdir()
    (team.work / ".forgehand" / "CODEOWNERS").write_text("*.py @bob\n/docs/ @dora\n")
    team.commit("main", "README.md", "readme\n")
    team.push("main")
    team.commit("change", "app.py", "x = 1\n", new=True)
    (team.work / "docs").mkdir()
    head = team.commit("change", "docs/guide.md", "guide\n")
    team.push("change")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "C", "head": "change", "base": "main"}).json()[
        "number"
    ]

    def unmet() -> list[str]:
        return team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"]

    assert unmet() == ["a code owner (@bob) must approve app.py", "a code owner (@dora) must approve docs/guide.md"]
    review = {"event": "APPROVE", "commit_id": head}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=review).is_success
    assert unmet() == ["a code owner (@dora) must approve docs/guide.md"]
    assert team.call("POST", f"{API}/pulls/{number}/reviews", dora, json=review).is_success
    assert unmet() == []

    # a CODEOWNERS the base cannot be read by blocks every merge into it, naming the line
    git("checkout", "main", cwd=team.work)
    (team.work / ".forgehand" / "CODEOWNERS").write_text("*.py @bob\ndocs/ @nobody\n")
    team.commit("main", "README.md", "readme 2\n")
    team.push("main")
    assert unmet() == ["CODEOWNERS line 2: @nobody is not an account (in .forgehand/CODEOWNERS on main: fix it there)"]
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"sha": head})
    assert r.status_code == 409 and r.json()["code"] == "branch_rule_unmet"


def test_a_merge_into_a_pull_requests_head_moves_it(team: Team) -> None:
    """Stacked pull requests: merging the upper one moves the lower one's head with it."""
    team.commit("lower", "l.txt", "l\n", new=True)
    team.push("lower")
    team.commit("upper", "u.txt", "u\n", new=True)
    team.push("upper")
    lower = team.call("POST", f"{API}/pulls", team.ana, json={"title": "L", "head": "lower", "base": "main"}).json()
    upper = team.call("POST", f"{API}/pulls", team.ana, json={"title": "U", "head": "upper", "base": "lower"}).json()
    merged = team.call("PUT", f"{API}/pulls/{upper['number']}/merge", team.bob, json={"strategy": "merge"})
    assert merged.status_code == 200, merged.text
    now = team.call("GET", f"{API}/pulls/{lower['number']}", team.ana).json()
    assert now["head"]["sha"] == merged.json()["sha"] != lower["head"]["sha"]
    assert now["changed_files"] == 2


def test_a_suggestion_is_committed_on_the_head(team: Team) -> None:
    team.commit("tune", "run.sh", "#!/bin/sh\necho one\necho two\n", new=True)
    git("update-index", "--chmod=+x", "run.sh", cwd=team.work)
    git("commit", "-m", "executable", cwd=team.work)
    head = git("rev-parse", "HEAD", cwd=team.work).stdout.strip()
    team.push("tune")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "T", "head": "tune", "base": "main"}).json()[
        "number"
    ]
    body = "Say it twice:\n```suggestion\necho ONE\necho once more\n```\n"
    review = {"event": "COMMENT", "commit_id": head, "comments": [{"path": "run.sh", "line": 2, "body": body}]}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=review).is_success
    [comment] = team.call("GET", f"{API}/pulls/{number}/comments", team.ana).json()
    assert comment["suggestion"] == ["echo ONE", "echo once more"]
    assert (
        team.call("POST", f"{API}/pulls/{number}/comments/{comment['id']}/apply-suggestion", team.rita).status_code
        == 403
    )

    r = team.call("POST", f"{API}/pulls/{number}/comments/{comment['id']}/apply-suggestion", team.ana)
    assert r.status_code == 200, r.text
    new_head = r.json()["head"]["sha"]
    assert new_head != head
    git("fetch", "origin", cwd=team.work)
    assert git("show", f"{new_head}:run.sh", cwd=team.work).stdout == "#!/bin/sh\necho ONE\necho once more\necho two\n"
    assert (
        git("log", "-1", "--format=%s|%an", new_head, cwd=team.work).stdout.strip() == "Apply suggestion from @bob|ana"
    )
    tree = git("ls-tree", new_head, "run.sh", cwd=team.work).stdout
    assert tree.startswith("100755")  # still executable
    # written on the old head now: applying it again is refused, nothing moves
    again = team.call("POST", f"{API}/pulls/{number}/comments/{comment['id']}/apply-suggestion", team.ana)
    assert again.status_code == 409 and again.json()["code"] == "head_moved"
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["head"]["sha"] == new_head


def test_a_line_comment_starts_a_thread_that_is_resolved_and_reopened(team: Team) -> None:
    team.commit("thread", "t.py", "a = 1\nb = 2\n", new=True)
    team.push("thread")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "T", "head": "thread", "base": "main"}).json()[
        "number"
    ]
    first = team.call(
        "POST", f"{API}/pulls/{number}/comments", team.bob, json={"body": "why 2?", "path": "t.py", "line": 2}
    )
    assert first.status_code == 201, first.text
    root = first.json()["id"]
    reply = team.call(
        "POST", f"{API}/pulls/{number}/comments", team.ana, json={"body": "spec says so", "in_reply_to": root}
    )
    assert reply.status_code == 201, reply.text
    assert (reply.json()["path"], reply.json()["line"], reply.json()["in_reply_to_id"]) == ("t.py", 2, root)
    # a reply to a reply joins the same thread
    again = team.call(
        "POST", f"{API}/pulls/{number}/comments", team.bob, json={"body": "ok", "in_reply_to": reply.json()["id"]}
    )
    assert again.json()["in_reply_to_id"] == root
    missing = team.call("POST", f"{API}/pulls/{number}/comments", team.bob, json={"body": "x", "in_reply_to": 999})
    assert missing.status_code == 404

    resolved = team.call("POST", f"{API}/pulls/{number}/comments/{root}/resolve", team.bob)
    assert resolved.status_code == 200 and resolved.json()["resolved"] is True
    assert resolved.json()["resolved_by"]["login"] == "bob"
    assert team.call("POST", f"{API}/pulls/{number}/comments/{root}/resolve", team.rita).status_code == 403
    reopened = team.call("POST", f"{API}/pulls/{number}/comments/{reply.json()['id']}/unresolve", team.ana)
    assert reopened.status_code == 200 and reopened.json()["id"] == root and reopened.json()["resolved"] is False
    lines = team.call("GET", f"{API}/pulls/{number}/comments", team.ana).json()
    assert [(c["body"], c["in_reply_to_id"]) for c in lines] == [("why 2?", None), ("spec says so", root), ("ok", root)]


def test_who_may_merge_and_whether_a_change_request_blocks(team: Team) -> None:
    bad = {"pattern": "main", "merge_allowlist": ["bob", "ghost"]}
    r = team.call("POST", f"{API}/branch-rules", team.ana, json=bad)
    assert r.status_code == 422 and r.json()["code"] == "invalid_mergers" and "ghost" in r.json()["detail"]
    rule = {"pattern": "main", "merge_allowlist": ["@Bob"], "block_on_requested_changes": False}
    made = team.call("POST", f"{API}/branch-rules", team.ana, json=rule).json()
    assert made["merge_allowlist"] == ["bob"] and made["block_on_requested_changes"] is False
    head = team.commit("gate", "g.txt", "g\n", new=True)
    team.push("gate")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "G", "head": "gate", "base": "main"}).json()[
        "number"
    ]
    no = {"event": "REQUEST_CHANGES", "body": "not yet", "commit_id": head}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=no).is_success
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == []  # does not block here
    refused = team.call("PUT", f"{API}/pulls/{number}/merge", team.ana, json={"sha": head})
    assert refused.status_code == 403 and refused.json()["code"] == "not_allowed_to_merge"
    assert "only @bob may merge into main" in refused.json()["detail"]
    assert team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={"sha": head}).status_code == 200


def test_a_pending_review_is_its_authors_until_published_with_a_verdict(team: Team) -> None:
    head = team.commit("draft", "d.py", "x = 1\ny = 2\n", new=True)
    team.push("draft")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "D", "head": "draft", "base": "main"}).json()[
        "number"
    ]
    one = {"comments": [{"path": "d.py", "line": 1, "body": "name x better"}]}
    r = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=one)
    assert r.status_code == 200 and r.json()["state"] == "PENDING", r.text
    review_id = r.json()["id"]
    two = {"comments": [{"path": "d.py", "line": 2, "body": "and y"}]}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=two).json()["id"] == review_id
    # bob sees his draft; ana sees nothing of it, and nothing was announced or counted
    assert [c["body"] for c in team.call("GET", f"{API}/pulls/{number}/comments", team.bob).json()] == [
        "name x better", "and y",
    ]  # fmt: skip
    assert team.call("GET", f"{API}/pulls/{number}/comments", team.ana).json() == []
    assert team.call("GET", f"{API}/pulls/{number}/reviews", team.ana).json() == []
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["review_comments"] == 0
    assert team.call("POST", f"{API}/pulls/{number}/reviews/{review_id}/events", team.ana,
                     json={"event": "COMMENT", "body": "x"}).status_code == 404  # fmt: skip

    r = team.call("POST", f"{API}/pulls/{number}/reviews/{review_id}/events", team.bob,
                  json={"event": "REQUEST_CHANGES", "body": "Two names to fix."})  # fmt: skip
    assert r.status_code == 200 and r.json()["state"] == "CHANGES_REQUESTED" and r.json()["commit_id"] == head
    assert len(team.call("GET", f"{API}/pulls/{number}/comments", team.ana).json()) == 2
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == ["changes requested by bob"]

    # a draft can be thrown away, with its comments
    r = team.call("POST", f"{API}/pulls/{number}/reviews", team.rita, json=one)
    assert r.status_code == 403  # a reader has no draft to write
    other = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=one).json()["id"]
    assert team.call("DELETE", f"{API}/pulls/{number}/reviews/{other}", team.bob).status_code == 204
    assert len(team.call("GET", f"{API}/pulls/{number}/comments", team.bob).json()) == 2


def test_a_deleted_or_force_pushed_head_is_marked_and_its_approvals_go(team: Team) -> None:
    rule = {"pattern": "main", "required_approvals": 1}  # dismiss_stale_approvals: on by default
    assert team.call("POST", f"{API}/branch-rules", team.ana, json=rule).json()["dismiss_stale_approvals"] is True
    head = team.commit("gone", "g.txt", "g\n", new=True)
    team.push("gone")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "G", "head": "gone", "base": "main"}).json()[
        "number"
    ]
    assert team.call(
        "POST", f"{API}/pulls/{number}/reviews", team.bob, json={"event": "APPROVE", "commit_id": head}
    ).is_success
    # force-push another commit in its place: the approval of the old head is dismissed
    git("reset", "--hard", "HEAD~1", cwd=team.work)
    rewritten = team.commit("gone", "g.txt", "rewritten\n")
    team.push("gone", "--force")
    pull = team.call("GET", f"{API}/pulls/{number}", team.ana).json()
    assert pull["head"]["sha"] == rewritten
    assert [r["state"] for r in team.call("GET", f"{API}/pulls/{number}/reviews", team.ana).json()] == ["DISMISSED"]
    # deleting the head branch leaves the pull request open, marked, unmergeable
    git("push", "origin", "--delete", "gone", cwd=team.work)
    pull = team.call("GET", f"{API}/pulls/{number}", team.ana).json()
    assert pull["state"] == "open" and pull["head"]["sha"] == "" and pull["mergeable"] is False
    assert pull["unmet_rules"] == [
        "the head branch gone was deleted", "1 approval(s) required by the rules of main, 0 given",
    ]  # fmt: skip
    r = team.call("PUT", f"{API}/pulls/{number}/merge", team.bob, json={})
    assert r.status_code == 409 and r.json()["code"] == "pull_head_gone"
    team.push("gone")  # pushed again, it is followed again
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["head"]["sha"] == rewritten


def test_forgehand_writes_no_head_a_push_could_not(team: Team) -> None:
    """Update branch on a pull request whose head takes changes through pull requests only is
    refused, as a push there would be; agent/* branches take no pull request into them."""
    git("checkout", "main", cwd=team.work)
    git("checkout", "-b", "evil", cwd=team.work)
    team.commit("evil", "evil.txt", "evil\n")
    team.push("evil")
    main_before = team.commit("main", "m.txt", "m\n")
    team.push("main")
    team.call("POST", f"{API}/branch-rules", team.ana, json={"pattern": "main", "require_pull_request": True})
    # main is one commit ahead of evil: a pull request of main into evil, whose Update branch
    # would merge evil into main without any review
    opened = team.call("POST", f"{API}/pulls", team.bob, json={"title": "x", "head": "main", "base": "evil"})
    assert opened.status_code == 201, opened.text
    r = team.call("PUT", f"{API}/pulls/{opened.json()['number']}/update-branch", team.bob, json={})
    assert r.status_code == 422 and r.json()["code"] == "pull_request_required", r.text
    branches = {b["name"]: b["sha"] for b in team.call("GET", f"{API}/branches", team.ana).json()}
    assert branches["main"] == main_before
    agent = {"title": "z", "head": "evil", "base": "Agent/1-x"}
    r = team.call("POST", f"{API}/pulls", team.bob, json=agent)
    assert r.status_code == 422 and r.json()["code"] == "invalid_pull_branches"


def test_titles_are_one_line_and_a_new_base_dismisses_approvals(team: Team) -> None:
    head = team.commit("one", "o.txt", "o\n", new=True)
    team.push("one")
    team.commit("other", "t.txt", "t\n", new=True)
    team.push("other")
    body = {"title": "Fix\nTask-Head: " + "a" * 40 + "\tnow", "head": "one", "base": "main"}
    pull = team.call("POST", f"{API}/pulls", team.ana, json=body).json()
    assert pull["title"] == "Fix Task-Head: " + "a" * 40 + " now"
    number = pull["number"]
    assert team.call(
        "POST", f"{API}/pulls/{number}/reviews", team.bob, json={"event": "APPROVE", "commit_id": head}
    ).is_success
    moved = team.call("PATCH", f"{API}/pulls/{number}", team.ana, json={"base": "other"})
    assert moved.status_code == 200, moved.text
    assert [r["state"] for r in team.call("GET", f"{API}/pulls/{number}/reviews", team.ana).json()] == ["DISMISSED"]


def test_a_reviewer_who_lost_write_access_neither_counts_nor_blocks(team: Team) -> None:
    head = team.commit("lost", "l.txt", "l\n", new=True)
    team.push("lost")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "L", "head": "lost", "base": "main"}).json()[
        "number"
    ]
    no = {"event": "REQUEST_CHANGES", "body": "no", "commit_id": head}
    assert team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=no).is_success
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == ["changes requested by bob"]
    assert team.call("PUT", f"{API}/collaborators/bob", team.ana, json={"role": "read"}).is_success
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == []


def test_nobody_approves_commits_they_pushed_themselves(team: Team) -> None:
    team.call("POST", f"{API}/branch-rules", team.ana, json={"pattern": "main", "required_approvals": 1})
    team.commit("shared", "s.txt", "s\n", new=True)
    team.push("shared")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "S", "head": "shared", "base": "main"}).json()[
        "number"
    ]
    # bob pushes to ana's branch, then approves: his own commit is not approved by him
    other = team.tmp / "bob-work"
    git("clone", team.clone_url(team.bob), str(other), cwd=team.tmp)
    git("checkout", "shared", cwd=other)
    (other / "b.txt").write_text("b\n")
    git("add", ".", cwd=other)
    git("commit", "-m", "bob's part", cwd=other)
    head = git("rev-parse", "HEAD", cwd=other).stdout.strip()
    git("push", "origin", "shared", cwd=other)
    assert team.call(
        "POST", f"{API}/pulls/{number}/reviews", team.bob, json={"event": "APPROVE", "commit_id": head}
    ).is_success
    unmet = team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"]
    assert unmet == ["1 approval(s) required by the rules of main, 0 given"]
    dora = team.token("dora", "repo:write", "reviews:write")
    assert team.call("PUT", f"{API}/collaborators/dora", team.ana, json={"role": "write"}).is_success
    assert team.call(
        "POST", f"{API}/pulls/{number}/reviews", dora, json={"event": "APPROVE", "commit_id": head}
    ).is_success
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == []


def test_an_admin_dismisses_a_standing_change_request(team: Team) -> None:
    head = team.commit("stuck", "x.txt", "x\n", new=True)
    team.push("stuck")
    number = team.call("POST", f"{API}/pulls", team.ana, json={"title": "S", "head": "stuck", "base": "main"}).json()[
        "number"
    ]
    no = {"event": "REQUEST_CHANGES", "body": "no", "commit_id": head}
    review = team.call("POST", f"{API}/pulls/{number}/reviews", team.bob, json=no).json()["id"]
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == ["changes requested by bob"]
    url = f"{API}/pulls/{number}/reviews/{review}/dismissals"
    refused = team.call("PUT", url, team.bob, json={"message": "mine"})
    assert refused.status_code == 403  # only repository admins dismiss
    empty = team.call("PUT", url, team.ana, json={"message": ""})
    assert empty.status_code == 422 and empty.json()["code"] == "validation_failed"
    r = team.call("PUT", url, team.ana, json={"message": "bob left the team"})
    assert r.status_code == 200 and r.json()["state"] == "DISMISSED", r.text
    assert team.call("GET", f"{API}/pulls/{number}", team.ana).json()["unmet_rules"] == []
    assert (
        team.call("PUT", f"{API}/pulls/{number}/reviews/9999/dismissals", team.ana, json={"message": "x"}).status_code
        == 404
    )


def test_a_pushed_commit_naming_an_issue_is_on_its_timeline(team: Team) -> None:
    r = team.call("POST", f"{API}/issues", team.ana, json={"title": "Tabs break the parser"})
    assert r.status_code == 201
    sha = team.commit("feature/tabs", "parse.py", "TAB = '\\t'\n", new=True)
    git("commit", "--amend", "-m", "Handle tabs (#1)", cwd=team.work)
    sha = git("rev-parse", "HEAD", cwd=team.work).stdout.strip()
    team.push("feature/tabs")
    team.push("feature/tabs")  # again: nothing new, nothing twice
    timeline = team.call("GET", f"{API}/issues/1/timeline", team.rita).json()
    assert [(e["event"], e["details"]["commit_id"], e["details"]["message"]) for e in timeline] == [
        ("referenced", sha, "Handle tabs (#1)")
    ]


def test_the_list_filters_by_reviewer(team: Team) -> None:
    for branch in ("feature/a", "feature/b"):
        team.commit(branch, f"{branch[-1]}.txt", "x\n", new=True)
        team.push(branch)
        git("checkout", "main", cwd=team.work)
        r = team.call("POST", f"{API}/pulls", team.ana, json={"title": branch, "head": branch, "base": "main"})
        assert r.status_code == 201, r.text
    assert team.call("POST", f"{API}/pulls/1/requested_reviewers", team.ana, json={"reviewers": ["bob"]}).is_success

    def numbers(query: str) -> list[int]:
        r = team.call("GET", f"{API}/pulls?{query}", team.rita)
        assert r.status_code == 200, r.text
        return [p["number"] for p in r.json()]

    assert numbers("reviewer=bob") == [1]
    head = team.call("GET", f"{API}/pulls/2", team.bob).json()["head"]["sha"]
    review = {"event": "COMMENT", "body": "Looks fine.", "commit_id": head}
    assert team.call("POST", f"{API}/pulls/2/reviews", team.bob, json=review).is_success
    assert numbers("reviewer=BOB") == [2, 1] and numbers("reviewer=nobody") == []
    page = httpx.get(
        f"{team.url}/ana/app/pulls?reviewer=bob", headers={"Authorization": f"Bearer {team.rita}"}, timeout=60
    )
    assert 'value="bob"' in page.text and ">feature/a<" in page.text.replace("<strong>", ">").replace("</strong>", "<")
