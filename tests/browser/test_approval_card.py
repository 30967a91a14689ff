"""The approval card in a real browser: a builtin-runtime task (a scripted model) calls `bash`, a
real policy consumer answers `ask`, the task page shows the parked call with its exact input, a
person approves it, and the task runs exactly that input and ends awaiting review."""

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.support.browser import ForgeServer
from tests.support.browser_ui import (
    add_collaborator,
    add_policy_hook,
    approval_card,
    create_bot,
    create_repo,
    decide_approval,
    expect_task_state,
    runs_table,
    sign_in,
    start_task,
    transcript,
)
from tests.support.model import ScriptedModel, reply, tool_call
from tests.support.policy import PolicyConsumer

pytestmark = [pytest.mark.browser, pytest.mark.docker]

REASON = "shell commands need a person"
# Characters a page could mangle (`<`, `&`, quotes) must reach the person exactly as they will run.
TOOL_INPUT = {"command": "echo '<approved> & ran' > approved.txt && cat approved.txt"}


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    with ScriptedModel([tool_call("bash", TOOL_INPUT, call_id="c1"), reply("Wrote approved.txt.")]) as scripted:
        yield scripted


@pytest.fixture
def consumer() -> Iterator[PolicyConsumer]:
    policy = PolicyConsumer({"pre_tool_use": (200, {"permission": {"decision": "ask", "reason": REASON}})})
    yield policy
    policy.server.shutdown()
    policy.server.server_close()


@pytest.fixture
def forge_settings(model: ScriptedModel) -> dict[str, Any]:
    """`forge` with the scripted model and policy endpoints allowed on 127.0.0.1."""
    return {"model_base_url": model.url, "model_name": "scripted", "webhooks_allowed_hosts": "127.0.0.1"}


def test_a_parked_tool_call_is_shown_approved_and_run(
    page: Page, forge: ForgeServer, model: ScriptedModel, consumer: PolicyConsumer, artifacts_dir: Path
) -> None:
    """Over 30 s under the parallel suite: a bot, a repository and two real sandbox runs (the call
    parked, then run once approved) driven through the pages, the card scanned at two widths."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    create_bot(page, forge.url, "fixer")
    repo = create_repo(page, forge.url, "guarded")
    add_collaborator(page, forge.url, repo, "fixer", "write")
    add_policy_hook(page, forge.url, repo, consumer.url, ["pre_tool_use"])

    number = start_task(page, forge.url, repo, goal="Write approved.txt", agent="fixer", runtime="builtin")
    # The run ends at the parked call and the task waits for a person; the page reloads into it.
    expect_task_state(page, "blocked", timeout_ms=90_000)
    card = approval_card(page)
    expect(card).to_be_visible()
    expect(card.get_by_role("heading", level=2)).to_have_text("Approval needed: bash")
    expect(card).to_contain_text(f"Reason: {REASON}")
    expect(card).to_contain_text(consumer.url)
    # Exactly the input that will run, `<`, `&` and quotes as they are.
    expect(card.locator("pre.approval-input")).to_have_text(json.dumps(TOOL_INPUT, indent=2, ensure_ascii=False))
    expect(card).to_contain_text("Expires at")
    expect(card.get_by_role("button", name="Approve and run")).to_be_enabled()
    expect(card.get_by_role("button", name="Deny")).to_be_enabled()
    # In the transcript the call is a pause, not a failure: the policy's ask before it, then what it waits for.
    parked = transcript(page).locator(".ti-tool").filter(has_text="bash")
    expect(parked.locator(".policy-before")).to_contain_text("pre_tool_use: ask")
    expect(parked.locator(".pause")).to_contain_text("waiting for your approval")
    expect(parked.locator(".pause")).to_contain_text(f"Reason: {REASON}")
    expect(parked.locator(".badge.outcome-error")).to_have_count(0)
    # While the call waits, there is no message form (a denial with a reason redirects the agent).
    expect(page.get_by_label(re.compile(r"^\s*Message the agent"))).to_have_count(0)
    card.screenshot(path=str(artifacts_dir / "approval-card.png"))
    page.screenshot(path=str(artifacts_dir / "approval-card-task-page.png"), full_page=True)
    assert consumer.types() == ["pre_tool_use"]
    assert consumer.seen[0]["data"]["tool_name"] == "bash"

    decide_approval(page, "approve", reason="fine, once")
    expect(page).to_have_url(re.compile(rf"/{re.escape(repo)}/tasks/{number}$"))
    expect_task_state(page, "awaiting review", timeout_ms=90_000)
    expect(approval_card(page)).to_have_count(0)
    runs = runs_table(page)
    expect(runs).to_have_count(2)
    expect(runs.nth(0)).to_contain_text("start")
    expect(runs.nth(1)).to_contain_text("approval")
    expect(runs.nth(1)).to_contain_text("succeeded")

    # The transcript: the call, the approval, and the command's real result.
    log = transcript(page)
    expect(log).to_contain_text("waits for approval")
    expect(log).to_contain_text(f"{forge.admin_login} approved the bash call")
    ran = log.locator(".ti-tool").filter(has_text="bash")
    expect(ran.locator(".pause")).to_contain_text(f"approved by {forge.admin_login}")
    result = ran.locator(".ev-tool_result")
    expect(result.locator("summary")).to_contain_text("exit code 0")
    result.locator("summary").click()
    expect(result.locator("pre")).to_contain_text("exit code 0")
    expect(result.locator("pre")).to_contain_text("<approved> & ran")
    expect(log).to_contain_text("Wrote approved.txt.")
    page.screenshot(path=str(artifacts_dir / "approval-card-approved.png"), full_page=True)

    # The approved call ran once, unasked (the consumer saw only the first), and its file is on the branch.
    assert consumer.types() == ["pre_tool_use"]
    [tool_message] = [m for m in model.requests[1]["messages"] if m["role"] == "tool"]
    assert tool_message["tool_call_id"] == "c1" and tool_message["content"].startswith("exit code 0")
    page.get_by_role("link", name="browse").click()
    page.locator("#tree").get_by_role("link", name="approved.txt", exact=True).click()
    expect(page.locator("#code code")).to_have_text("<approved> & ran")
