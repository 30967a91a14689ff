"""The task flow in a real browser: sign in, create a repository, hand a `command` task to a bot,
watch its transcript arrive live, and find its work on the task branch."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import ForgeServer
from tests.support.browser_ui import (
    add_collaborator,
    create_bot,
    create_repo,
    expect_task_state,
    mark_page,
    sign_in,
    start_command_task,
    task_state,
    transcript,
    transcript_output,
    was_reloaded,
)

pytestmark = [pytest.mark.browser, pytest.mark.docker]

# The sandbox takes a moment to start; the sleep before the line we watch for makes sure it is not
# in the page as first rendered, so it can only arrive over the live stream.
COMMAND = "echo greeting-begins; sleep 4; echo hello > hello.txt; echo wrote-hello-txt; sleep 2; echo greeting-done"


def test_a_command_task_streams_its_transcript_and_waits_for_review(
    page: Page, forge: ForgeServer, artifacts_dir: Path
) -> None:
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    expect(page.get_by_role("heading", name=f"Welcome, {forge.admin_login}")).to_be_visible()

    create_bot(page, forge.url, "fixer")
    repo = create_repo(page, forge.url, "greeter", description="says hello")
    assert repo == f"{forge.admin_login}/greeter"
    expect(page.locator("#tree")).to_contain_text("README.md")
    add_collaborator(page, forge.url, repo, "fixer", "write")

    number = start_command_task(
        page, forge.url, repo, goal="Write a greeting to hello.txt", agent="fixer", command=COMMAND
    )
    assert number == 1
    expect(page.get_by_role("heading", level=1)).to_contain_text("#1 Write a greeting to hello.txt")
    expect(page.locator("dl.facts")).to_contain_text("fixer (command)")
    expect(page.locator("#command")).to_have_text(COMMAND)
    expect(page.locator("dl.facts")).to_contain_text("agent/1-")
    # As first rendered: still queued or running, and the late line not there yet.
    expect(task_state(page)).to_have_text(re.compile(r"^\s*(queued|running)\b"))
    assert "wrote-hello-txt" not in transcript(page).inner_text()
    mark_page(page)

    # The transcript grows in place, over the live stream: the same document, not a reload.
    output = transcript_output(page)
    expect(output.first).to_have_text("greeting-begins", timeout=90_000)
    expect(output.nth(1)).to_have_text("wrote-hello-txt", timeout=60_000)
    assert not was_reloaded(page), "the transcript line came with a reload, not live"
    page.screenshot(path=str(artifacts_dir / "task-flow-live-transcript.png"), full_page=True)

    # When the run ends the page reloads itself and shows the task waiting for review.
    expect_task_state(page, "awaiting review", timeout_ms=120_000)
    assert was_reloaded(page)
    expect(transcript_output(page)).to_have_text(["greeting-begins", "wrote-hello-txt", "greeting-done"])
    expect(transcript(page)).to_contain_text("1 file changed")
    runs = page.locator("table.list tbody tr").first
    expect(runs).to_contain_text("start")
    expect(runs).to_contain_text("succeeded")
    page.screenshot(path=str(artifacts_dir / "task-flow-awaiting-review.png"), full_page=True)
    assert (artifacts_dir / "task-flow-awaiting-review.png").stat().st_size > 0

    # The work is on the task branch: browse it and open the new file.
    page.get_by_role("link", name="browse").click()
    tree = page.locator("#tree")
    expect(tree).to_contain_text("hello.txt")
    expect(tree).to_contain_text("README.md")
    tree.get_by_role("link", name="hello.txt", exact=True).click()
    expect(page).to_have_url(re.compile(r"/blob/hello\.txt\?ref=agent/1-"))
    expect(page.locator("#code code")).to_have_text("hello")
