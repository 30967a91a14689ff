"""A human pull request in a real browser, as a new team would use it: a person pushes
`feature/x` with the real git CLI and follows the link the push answers with, opens a pull request
from the compare page, a second collaborator comments on a line and requests changes, the author
pushes a fix, the reviewer approves, a CI script reports the `success` the branch rule requires,
and the merge lands on main."""

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.accounts import PASSWORD, Accounts, make_account_with_token
from tests.support.browser import ForgeServer, run_async
from tests.support.browser_ui import (
    add_collaborator,
    create_bot,
    create_repo,
    expect_task_state,
    runs_table,
    sign_in,
    start_command_task,
)
from tests.support.git import git

pytestmark = [pytest.mark.browser]


def _user(site: ForgeServer, login: str) -> None:
    from forge.accounts import accounts

    async def go() -> None:
        db = Database(site.settings.effective_database_url)
        try:
            async with db.session(write=True) as s:
                await accounts.create_user(s, Actor.system("test"), login, PASSWORD)
        finally:
            await db.dispose()

    run_async(go())


def _token(site: ForgeServer, login: str, *scopes: str) -> str:
    async def go() -> str:
        db = Database(site.settings.effective_database_url)
        try:
            return await Accounts(db=db).token(login, *scopes)
        finally:
            await db.dispose()

    return run_async(go())


def _push(work: Path, branch: str) -> str:
    return git("push", "origin", branch, cwd=work).stderr


def _commit(work: Path, name: str, text: str) -> str:
    (work / name).write_text(text)
    git("add", ".", cwd=work)
    git("commit", "-m", f"change {name}", cwd=work)
    return git("rev-parse", "HEAD", cwd=work).stdout.strip()


def test_a_person_opens_a_pull_request_it_is_reviewed_checked_and_merged(
    page: Page, browser: Browser, forge: ForgeServer, tmp_path: Path, artifacts_dir: Path
) -> None:
    """One flow because each step needs the one before; two browsers, real pushes."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    _user(forge, "bob")
    repo = create_repo(page, forge.url, "shop", description="the shop")
    add_collaborator(page, forge.url, repo, "bob", "write")
    token = run_async(make_account_with_token(forge.settings, "ci", "repo:write"))
    add_collaborator(page, forge.url, repo, "ci", "write")
    admin_token = _token(forge, forge.admin_login, "repo:write")
    api = f"{forge.url}/api/v1/repos/{repo}"
    rule = {"pattern": "main", "required_approvals": 1, "required_checks": ["ci/build"]}
    headers = {"Authorization": f"Bearer {admin_token}"}
    httpx.post(f"{api}/branch-rules", json=rule, headers=headers, timeout=30).raise_for_status()

    # --- the author pushes a branch; the push answers with the link that opens a pull request ----
    work = tmp_path / "work"
    host = forge.url.removeprefix("http://")
    git("clone", f"http://x:{admin_token}@{host}/{repo}.git", str(work), cwd=tmp_path)
    git("checkout", "-b", "feature/x", cwd=work)
    _commit(work, "price.py", "def price():\n    return 10\n")
    answer = _push(work, "feature/x")
    link = re.search(r"(http://\S+/compare/main\.\.\.feature/x)", answer)
    assert link, answer
    page.goto(link.group(1))
    page.get_by_role("link", name="Create pull request").click()
    expect(page.get_by_label("Head: the branch with the changes")).to_have_value("feature/x")
    page.get_by_label("Title", exact=True).fill("Price is ten")
    page.get_by_label("Description (markdown)").fill("Sets the **price**.<script>alert(1)</script>")
    page.get_by_role("button", name="Create pull request").click()
    expect(page).to_have_url(re.compile(rf"/{re.escape(repo)}/pull/1$"))
    expect(page.locator("#pull-title")).to_contain_text("Price is ten #1")
    expect(page.locator("#pull-state")).to_have_text("open")
    expect(page.locator("#description strong")).to_have_text("price")
    expect(page.locator("#description script")).to_have_count(0)
    expect(page.locator("#unmet-rules li")).to_have_text([
        "1 approval(s) required by the rules of main, 0 given", "required check ci/build has not reported",
    ])  # fmt: skip
    expect(page.get_by_role("button", name="Merge into main")).to_be_disabled()
    expect(page.get_by_role("link", name="Pull requests")).to_be_visible()

    # --- the author asks bob, whose dashboard shows it; bob comments on a line, requests changes --
    asked = {"reviewers": ["bob"]}
    r = httpx.post(f"{api}/pulls/1/requested_reviewers", json=asked, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    bob_context = browser.new_context()
    bob = bob_context.new_page()
    try:
        sign_in(bob, forge.url, "bob", PASSWORD)
        waiting = bob.locator("#pulls-awaiting-review li")
        expect(waiting).to_have_count(1)
        expect(waiting).to_contain_text(f"Price is ten {repo}#1 by {forge.admin_login} review requested")
        waiting.get_by_role("link", name="Price is ten").click()
        row = bob.locator("table.diff[data-path='price.py'] tr[data-side='RIGHT'][data-line='2']")
        row.locator("summary").click()
        row.get_by_label("Comment on price.py line 2 (markdown)").fill("Ten is too cheap: **twelve**.")
        row.get_by_role("button", name="Add to review").click()
        # gathered in bob's pending review, which only he sees, until he submits it
        expect(bob.locator("#pending-review")).to_contain_text("Your pending review: 1 comment")
        page.reload()
        expect(page.locator("table.diff .inline-comment")).to_have_count(0)
        bob.get_by_label("Review (markdown)").fill("Please raise it.")
        bob.get_by_label("Request changes").check()
        bob.get_by_role("button", name="Submit review").click()
        expect(bob.locator("article.review")).to_contain_text("bob requested changes")
        expect(bob.locator("article.review .inline-comment")).to_contain_text("price.py:2")
        expect(bob.locator("#pending-review")).to_have_count(0)
        expect(bob.locator("table.diff .inline-comment")).to_contain_text(
            re.compile(r"bob:\s*Ten is too cheap: twelve\.")
        )
        bob.goto(f"{forge.url}/")
        expect(bob.locator("#pulls-awaiting-review li")).to_have_text(["No pull request waits for your review."])
        bob.go_back()

        # --- the author pushes the fix; the comment is now on an old head ---------------------------
        fixed = _commit(work, "price.py", "def price():\n    return 12\n")
        answer = _push(work, "feature/x")
        assert f"{forge.url}/{repo}/pull/1" in answer, answer
        page.reload()
        expect(page.locator("#unmet-rules li")).to_contain_text(["changes requested by bob"])
        expect(page.locator("table.diff[data-path='price.py']")).to_contain_text("+    return 12")
        # the author answers in bob's thread (now on an old head) and resolves it
        thread = page.locator("details.thread")
        thread.get_by_label("Reply to the thread on price.py line 2").fill("Raised to **twelve**.")
        thread.get_by_role("button", name="Reply").click()
        expect(page.locator("details.thread .inline-comment")).to_have_count(2)
        expect(page.locator("details.thread .inline-comment").nth(1)).to_contain_text("Raised to twelve.")
        page.locator("details.thread").get_by_role("button", name="Resolve conversation").click()
        expect(page.locator("details.thread summary")).to_have_text(f"2 comments · resolved by {forge.admin_login}")

        # --- bob approves the new head --------------------------------------------------------------
        bob.reload()
        expect(bob.locator("table.diff .inline-comment .badge")).to_have_text("outdated")
        bob.get_by_label("Approve").check()
        bob.get_by_role("button", name="Submit review").click()
        expect(bob.locator("article.review").last).to_contain_text(f"bob approved on {fixed[:12]}")
    finally:
        bob_context.close()

    # --- the author reads the commits, then the diff side by side -----------------------------------
    page.reload()
    page.get_by_role("link", name="Commits (2)").click()
    expect(page.locator("#pull-commits .summary a")).to_have_text(["change price.py", "change price.py"])
    page.get_by_role("link", name="Split").click()
    expect(page).to_have_url(re.compile(r"/pull/1/files\?view=split#files$"))
    expect(page.locator("table.diff.split[data-path='price.py'] td.src.add")).to_have_text(
        ["def price():", "    return 12"]
    )
    page.screenshot(path=str(artifacts_dir / "pull-flow-split.png"), full_page=True)

    # --- CI reports; the merge lands -----------------------------------------------------------------
    page.reload()
    expect(page.locator("#unmet-rules li")).to_have_text(["required check ci/build has not reported"])
    status = {"state": "success", "context": "ci/build", "target_url": "https://ci.example/42"}
    ci = {"Authorization": f"Bearer {token}"}
    assert httpx.post(f"{api}/statuses/{fixed}", json=status, headers=ci, timeout=30).status_code == 201
    page.reload()
    expect(page.locator("#ready")).to_have_text("Every rule holds: ready to merge.")
    expect(page.locator("#head-checks")).to_contain_text("ci/build: success")
    page.screenshot(path=str(artifacts_dir / "pull-flow-ready.png"), full_page=True)
    page.get_by_role("button", name="Merge into main").click()
    expect(page.locator("#pull-state")).to_have_text("merged")
    expect(page.locator("#merged")).to_contain_text(f"Merged by {forge.admin_login} into main")
    merged = page.locator("#merged a code").inner_text()
    branches = httpx.get(f"{api}/branches", headers=headers, timeout=30).json()
    assert {b["name"]: b["sha"] for b in branches}["main"].startswith(merged)
    page.goto(f"{forge.url}/{repo}/pulls?state=merged")
    expect(page.locator("#pulls li")).to_contain_text(["Price is ten"])


def test_a_tasks_work_is_a_pull_request_reviewed_and_merged_on_its_page(page: Page, forge: ForgeServer) -> None:
    """A task's changes appear as a pull request linked from the task; its old review URL leads
    there; a line comment gathered in a pending review and a change request written on the pull
    request's page send the agent back; approve and merge there finish the task. Two real runs in a
    sandbox make it longer than most."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "stamper")
    repo = create_repo(page, forge.url, "stamps")
    add_collaborator(page, forge.url, repo, "stamper", "write")
    start_command_task(page, forge.url, repo, goal="Stamp it", agent="stamper", command="date +%s%N > stamp.txt")
    expect_task_state(page, "awaiting review")
    page.goto(f"{forge.url}/{repo}/pulls")
    page.get_by_role("link", name="Stamp it").click()
    expect(page.locator("#pull-title")).to_contain_text("Stamp it #1")
    expect(page.locator("#task-work")).to_contain_text("task #1")
    first = page.locator("table.diff[data-path='stamp.txt']").inner_text()
    # the task's review page is the pull request's Files changed tab now
    page.goto(f"{forge.url}/{repo}/tasks/1/review")
    expect(page).to_have_url(re.compile(rf"/{re.escape(repo)}/pull/1/files$"))
    expect(page.locator("#approval-count")).to_have_text("0")

    row = page.locator("table.diff[data-path='stamp.txt'] tr[data-side='RIGHT'][data-line='1']")
    row.locator("summary").click()
    row.get_by_label("Comment on stamp.txt line 1 (markdown)").fill("Use **seconds** only.")
    row.get_by_role("button", name="Add to review").click()
    expect(page.locator("#pending-review")).to_contain_text("Your pending review: 1 comment")
    expect(page.locator("table.diff .inline-comment.pending")).to_contain_text("Use seconds only.")

    page.get_by_label("Review (markdown)").fill("Stamp it again, please.")
    page.get_by_label("Request changes").check()
    page.get_by_role("button", name="Submit review").click()
    review = page.locator("article.review")
    expect(review).to_contain_text(f"{forge.admin_login} requested changes")
    expect(review.locator(".inline-comment")).to_contain_text("stamp.txt:1")
    expect(page.locator("#pending-review")).to_have_count(0)
    page.goto(f"{forge.url}/{repo}/tasks/1")
    expect_task_state(page, "awaiting review")
    expect(runs_table(page)).to_have_count(2)
    prompt = page.locator("#transcript .ev-prompt").last
    expect(prompt).to_contain_text("stamp.txt, line 1:")  # the agent was handed the line comment
    expect(prompt).to_contain_text("Use **seconds** only.")
    page.goto(f"{forge.url}/{repo}/pull/1")
    assert page.locator("table.diff[data-path='stamp.txt']").inner_text() != first  # the agent's new head
    expect(page.locator("article.review")).to_have_class(re.compile(r"\boutdated\b"))
    expect(page.locator("article.review")).to_contain_text("started run 2")

    page.get_by_label("Approve").check()
    page.get_by_role("button", name="Submit review").click()
    expect(page.locator("#approval-count")).to_have_text("1")
    expect(page.locator("#ready")).to_have_text("Every rule holds: ready to merge.")
    page.get_by_role("button", name="Merge into main").click()
    expect(page.locator("#pull-state")).to_have_text("merged")
    expect(page.locator("#merged")).to_contain_text(f"Merged by {forge.admin_login} (merge) into main")
    expect(page.locator("article.review")).to_have_count(2)  # the task's reviews stay on the merged pull request
    page.goto(f"{forge.url}/{repo}/tasks/1")
    expect_task_state(page, "merged")
