"""The review flow in a real browser: a `command` task writes a file, a person comments on a line of
the diff and requests changes, the agent's follow-up run (the same command, now with the change
request as `FORGEHAND_PROMPT`) moves the head, the earlier review reads outdated, the person
approves and merges, and the default branch has the new content."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import ForgeServer
from tests.support.browser_ui import (
    add_collaborator,
    comment_on_line,
    create_bot,
    create_repo,
    expect_task_state,
    mark_page,
    merge_blockers,
    merge_button,
    merge_task,
    open_review,
    runs_table,
    sign_in,
    start_command_task,
    submit_review,
    task_state,
    transcript,
    transcript_output,
    was_reloaded,
)

pytestmark = [pytest.mark.browser, pytest.mark.docker]

GOAL = "Greet the reader in hello.txt"
# Every run writes `hello`; a run asked to "say hi" (the change request: the review's body and its
# inline comments, in FORGEHAND_PROMPT) writes `hi` instead. The first run's prompt is the goal,
# which does not say so. The sleeps keep the watched lines out of the page as first rendered.
COMMAND = (
    "echo greeting-begins; sleep 4; echo hello > hello.txt; "
    "if printf '%s' \"$FORGEHAND_PROMPT\" | grep -q 'say hi'; then echo hi > hello.txt; echo changed-as-asked; fi; "
    "echo wrote-hello-txt; sleep 2; echo greeting-done"
)
INLINE = "Too formal: say hi here."
BODY = "Nearly there: one **wording** change, see the comment."


def test_review_request_changes_approve_and_merge(page: Page, forge: ForgeServer, artifacts_dir: Path) -> None:
    """Review through the pages: a task runs in a real sandbox, changes are requested, the second run
    answers them, then approval and merge. Two real runs and the review rounds make it over 30 s;
    one test because each step needs the one before."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "fixer")
    repo = create_repo(page, forge.url, "greeter", description="says hello")
    add_collaborator(page, forge.url, repo, "fixer", "write")

    # --- the first run, watched live ---------------------------------------------------------------
    number = start_command_task(page, forge.url, repo, goal=GOAL, agent="fixer", command=COMMAND)
    expect(task_state(page)).to_have_text(re.compile(r"^\s*(queued|running)\b"))
    expect(page.locator("#review-link")).to_have_count(0)  # nothing to review yet
    mark_page(page)
    output = transcript_output(page)
    expect(output.first).to_have_text("greeting-begins", timeout=90_000)
    expect(output.nth(1)).to_have_text("wrote-hello-txt", timeout=60_000)
    assert not was_reloaded(page), "the transcript line came with a reload, not live"
    expect_task_state(page, "awaiting review")
    expect(transcript_output(page)).to_have_text(["greeting-begins", "wrote-hello-txt", "greeting-done"])
    expect(page.locator("#review-link")).to_have_text("Review the changes")

    # --- the review, on the task's pull request: the diff, a blocked merge, an inline comment -------
    open_review(page)
    pull_url = page.url.removesuffix("/files")
    first_head = page.locator("#head-sha").inner_text()
    diff = page.locator("table.diff[data-path='hello.txt']")
    expect(diff).to_contain_text("+hello")
    expect(page.locator("#approval-count")).to_have_text("0")
    # Not approved yet: the merge button is disabled and says why.
    expect(merge_button(page)).to_be_disabled()
    expect(merge_blockers(page)).to_contain_text([re.compile(r"approval\(s\) of the current head needed.*0 given")])
    expect(page.locator("text=No reviews or comments yet.")).to_be_visible()

    comment_on_line(page, "hello.txt", 1, INLINE)
    expect(page.locator("table.diff .inline-comment")).to_have_text(
        re.compile(rf"{forge.admin_login}:\s*{re.escape(INLINE)}")
    )
    comment_review = page.locator("article.review")
    expect(comment_review).to_have_count(1)
    expect(comment_review).to_contain_text(f"{forge.admin_login} commented on {first_head}")
    expect(comment_review.locator(".inline-comment")).to_contain_text("hello.txt:1")
    expect(comment_review.locator(".inline-comment pre")).to_have_text("hello")
    expect(merge_button(page)).to_be_disabled()  # a comment is no approval
    page.screenshot(path=str(artifacts_dir / "review-flow-review-page-commented.png"), full_page=True)

    # --- request changes: a follow-up run with the change request, watched on the task page -------
    submit_review(page, "request_changes", BODY)
    expect(page.locator("article.review").last).to_contain_text(f"{forge.admin_login} requested changes")
    page.goto(forge.at(f"/{repo}/tasks/{number}"))
    expect(runs_table(page)).to_have_count(2)
    follow_up = runs_table(page).nth(1)
    expect(follow_up).to_contain_text("review")
    expect_task_state(page, "awaiting review")
    expect(follow_up).to_contain_text("succeeded")
    # The agent was handed the body and the inline comment (with its file, line and code).
    prompt = transcript(page).locator(".ev-prompt").last
    expect(prompt).to_contain_text(f"{forge.admin_login} reviewed your changes and requests changes.")
    expect(prompt).to_contain_text(BODY)
    expect(prompt).to_contain_text(f"hello.txt, line 1: > hello {INLINE}")
    expect(transcript_output(page).filter(has_text="changed-as-asked")).to_have_count(1)
    page.screenshot(path=str(artifacts_dir / "review-flow-task-page.png"), full_page=True)

    # --- the pull request again: the head moved, the earlier reviews are outdated -----------------
    open_review(page)
    second_head = page.locator("#head-sha").inner_text()
    assert second_head != first_head, "the follow-up run did not move the head"
    expect(page.locator("table.diff[data-path='hello.txt']")).to_contain_text("+hi")
    earlier = page.locator("article.review")
    expect(earlier).to_have_count(2)
    for i in range(2):
        expect(earlier.nth(i)).to_have_class(re.compile(r"\boutdated\b"))
        expect(earlier.nth(i).locator("p").first).to_contain_text(f"on {first_head}")
        expect(earlier.nth(i).locator("p").first).to_contain_text("outdated")
    expect(earlier.nth(1)).to_contain_text(f"{forge.admin_login} requested changes")
    expect(earlier.nth(1)).to_contain_text("started run 2")
    expect(earlier.nth(1).locator(".markdown strong")).to_have_text("wording")
    expect(earlier.nth(0).locator(".inline-comment")).to_have_class(re.compile(r"\boutdated\b"))
    # An outdated comment no longer sits under a line of the new diff.
    expect(page.locator("table.diff .inline-comment")).to_have_count(0)
    expect(merge_button(page)).to_be_disabled()
    expect(merge_blockers(page)).to_contain_text(
        [re.compile(r"approval\(s\) of the current head needed"), f"changes requested by {forge.admin_login}"]
    )

    # --- approve, then merge ------------------------------------------------------------------------
    submit_review(page, "approve", "Looks good now.")
    expect(page.locator("#approval-count")).to_have_text("1")
    expect(merge_blockers(page)).to_have_count(0)
    expect(merge_button(page)).to_be_enabled()
    expect(merge_button(page)).to_have_text("Merge into main")
    latest = page.locator("article.review").last
    expect(latest).to_contain_text(f"{forge.admin_login} approved on {second_head}")
    expect(latest).not_to_have_class(re.compile(r"\boutdated\b"))
    page.screenshot(path=str(artifacts_dir / "review-flow-review-page-approved.png"), full_page=True)

    merged_sha = merge_task(page)
    assert page.url.startswith(pull_url)
    expect(page.locator("#pull-state")).to_have_text("merged")
    expect(page.locator("#merged")).to_contain_text(
        f"Merged by {forge.admin_login} (merge) into main as {merged_sha[:12]}"
    )
    expect(page.locator("#merge-form")).to_have_count(0)
    expect(page.locator("#review-form")).to_have_count(0)

    # --- the default branch has the merge commit and the new content ------------------------------
    page.goto(forge.at(f"/{repo}/commits"))
    newest = page.locator("#commits tr").first
    expect(newest).to_contain_text(f"Merge task #{number}: {GOAL}")
    expect(newest.get_by_role("link", name=merged_sha[:10])).to_have_attribute("href", f"/{repo}/commit/{merged_sha}")
    page.goto(forge.at(f"/{repo}"))
    tree = page.locator("#tree")
    expect(tree).to_contain_text("hello.txt")
    tree.get_by_role("link", name="hello.txt", exact=True).click()
    expect(page.locator("#code code")).to_have_text("hi")

    # The task page says so too.
    page.goto(forge.at(f"/{repo}/tasks/{number}"))
    expect(task_state(page)).to_have_text(re.compile(r"^\s*merged\b"))
    expect(page.locator("#review-link")).to_have_text("Reviews and merge")
    expect(page.locator("dl.facts")).to_contain_text(f"merged as {merged_sha[:12]}")
