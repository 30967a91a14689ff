"""The task pages in a real browser, by keyboard where a person would use one: start a task from the
form, follow its live transcript without being moved (the "new events" button), read a transcript
of every kind, approve and merge it with Tab and Enter. Each page is scanned with axe-core at
desktop and phone width, screenshotted, and nothing it loads leaves the instance."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, run_async
from tests.support.browser_keys import tab_to
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, expect_task_state, sign_in
from tests.support.transcripts import COMMAND, record_on_server

pytestmark = [pytest.mark.browser, pytest.mark.docker]

# Slow enough that its output arrives while the reader looks at the top of the page.
SCRIPT = "printf 'hello\\n' > hello.txt\nfor i in $(seq 1 25); do echo line-$i; sleep 0.4; done"


def test_start_follow_read_approve_and_merge_by_keyboard(page: Page, forge: ForgeServer, artifacts_dir: Path) -> None:
    """A whole task life by keyboard only: a bot, a repository, a task run in a real sandbox, its
    transcript followed live, the review and the merge. Over 30 s because a real container runs
    and each page is scanned; one test because each step needs the one before."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "fixer")
    repo = create_repo(page, forge.url, "greeter", description="says hello")
    add_collaborator(page, forge.url, repo, "fixer", "write")

    with no_foreign_requests(page):
        page.goto(forge.url + "/")
        expect(page.locator("#awaiting-review")).to_contain_text("Nothing awaits your review.")
        check_page(page, artifacts_dir, "tasks-dashboard")

        # --- the start form, by keyboard ------------------------------------------------------------
        page.goto(f"{forge.url}/{repo}/tasks/")
        expect(page.locator("#agent option")).to_have_text(["fixer"])  # the one bot that may work here
        expect(page.locator("#runtime-builtin-why")).to_contain_text("none is set up here")
        check_page(page, artifacts_dir, "tasks-start-form")
        tab_to(page, "#goal")
        page.keyboard.type("Greet the world")
        tab_to(page, "input[name=runtime]")  # the group's one tab stop: the chosen radio
        expect(page.locator("#runtime-command")).to_be_focused()  # the only runtime that can run here
        expect(page.locator("#runtime-command")).to_be_checked()
        tab_to(page, "#command")
        page.keyboard.type(SCRIPT)  # several lines: Enter in a textarea is a line break
        tab_to(page, "#start-form button[type=submit]")
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(rf"/{re.escape(repo)}/tasks/1$"))
        expect(page.locator("#waiting")).to_contain_text(re.compile(r"Waiting for a worker|The agent is working"))
        # The badge and the line under the title change together (live, as a worker takes the run).
        expect(page.locator("h1 .badge")).to_have_text("running", timeout=60_000)
        expect(page.locator("#waiting")).to_contain_text("The agent is working")

        # --- live: the reader at the top is not moved; a button offers the new events -------------
        page.set_viewport_size({"width": 1280, "height": 480})
        page.evaluate("window.scrollTo(0, 0)")
        pill = page.locator("#new-events")
        expect(pill).to_be_visible(timeout=90_000)
        expect(pill).to_have_text(re.compile(r"^\d+ new events?$"))
        assert page.evaluate("window.scrollY") == 0, "the page moved the reader"
        pill.focus()
        page.keyboard.press("Enter")
        expect(pill).to_be_hidden()
        assert page.evaluate("window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 48")
        page.set_viewport_size({"width": 1280, "height": 900})
        expect_task_state(page, "awaiting review", timeout_ms=120_000)
        expect(page.locator("#transcript .ev-stdout .chunk").filter(has_text="line-25")).to_have_count(1)
        expect(page.locator("#waiting")).to_contain_text("Waiting for your review")
        expect(page.locator("#branch-link")).to_have_text(re.compile(r"agent/1-"))

        # --- a transcript of every kind --------------------------------------------------------------
        run_async(record_on_server(forge.settings, 1))
        page.reload()
        log = page.locator("#transcript")
        card = log.locator(".ti-tool").filter(has_text="bash").first
        card.locator(".tool-input > summary").click()
        expect(card.locator(".tool-input pre")).to_have_text(COMMAND)  # as written, no JSON escapes
        expect(card.locator(".ev-tool_result summary")).to_contain_text("exit code 0")
        # The call between its decisions: pre_tool_use above it, post_tool_use below its outcome.
        expect(card.locator(".policy-before")).to_contain_text("pre_tool_use: allow")
        expect(card.locator(".policy-after")).to_contain_text("post_tool_use: allow")
        fetch = log.locator(".ti-tool").filter(has_text="web_fetch")
        expect(fetch.locator(".policy-before")).to_contain_text("Reason: no network tools here")
        # Plumbing in one line each, the details on demand.
        expect(log.locator(".ti-model > summary")).to_contain_text("Model call: claude-test · 1,200 in / 80 out")
        expect(log.locator(".ti-model .facts-line")).to_be_hidden()
        expect(log.locator(".ti-generic")).to_contain_text("cache report")
        long_output = log.locator(".ti-output .fold.long").first
        long_output.locator("button.show-all").click()
        expect(long_output).to_have_class(re.compile(r"\bexpanded\b"))
        check_page(page, artifacts_dir, "tasks-task-page")
        # Each item's icon is drawn from the page's one definition of it.
        assert card.locator("header .icon use").evaluate("u => u.getBBox().width") > 0
        log.screenshot(path=str(artifacts_dir / "tasks-transcript.png"))
        page.goto(f"{forge.url}/{repo}/tasks/1?run=1")
        expect(page.locator("#run-select")).to_have_value("1")

        page.goto(f"{forge.url}/{repo}/tasks/")
        expect(page.locator("#task-list")).to_contain_text("Greet the world")
        check_page(page, artifacts_dir, "tasks-list")
        page.goto(forge.url + "/")
        expect(page.locator("#awaiting-review")).to_contain_text(f"{repo}#1 Greet the world")

        # --- approve and merge, by keyboard ----------------------------------------------------------
        page.goto(f"{forge.url}/{repo}/tasks/1/review")  # the task's pull request's Files changed tab
        expect(page).to_have_url(re.compile(rf"/{re.escape(repo)}/pull/1/files$"))
        expect(page.locator("table.diff[data-path='hello.txt']")).to_be_visible()
        check_page(page, artifacts_dir, "tasks-review-page")
        tab_to(page, "#review-form input[name=event][value=COMMENT]")
        page.keyboard.press("ArrowDown")  # arrows move within a radio group
        expect(page.locator("#review-form input[value=APPROVE]")).to_be_checked()
        tab_to(page, "#review-form button[type=submit]")
        page.keyboard.press("Enter")
        expect(page.locator("#approval-count")).to_have_text("1")
        tab_to(page, "#merge-form button[type=submit]")
        page.keyboard.press("Enter")
        expect(page.locator("#merged")).to_contain_text("Merged by")
        expect(page.locator("table.diff[data-path='hello.txt']")).to_be_visible()  # the merged diff stays
        page.goto(f"{forge.url}/{repo}/tasks/?state=merged")
        expect(page.locator("#task-list")).to_contain_text("Greet the world")
        page.goto(forge.url + "/")
        expect(page.locator("#awaiting-review")).to_contain_text("Nothing awaits your review.")
