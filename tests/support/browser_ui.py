"""What a person does in the web UI, as Playwright steps (sync API). Each helper drives the real
forms the way a user would (labels, buttons), then waits for what the user would see next, so a
test that calls it fails at the step that broke."""

import re
from typing import Literal

from playwright.sync_api import Locator, Page, expect

Visibility = Literal["private", "internal", "public"]
Role = Literal["read", "write", "admin"]
Runtime = Literal["command", "builtin"]
Verdict = Literal["comment", "approve", "request_changes"]
FailurePolicy = Literal["closed", "open", "hold"]
Strategy = Literal["merge", "squash", "fast-forward"]

_MARK = "__forgehandTestMark"


def sign_in(page: Page, base_url: str, login: str, password: str) -> None:
    """Sign in through the sign-in form; returns on the page it redirects to (the dashboard)."""
    page.goto(f"{base_url}/signin")
    page.get_by_label("Login", exact=True).fill(login)
    page.get_by_label("Password", exact=True).fill(password)
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("button", name="Sign out")).to_be_visible()
    expect(page.locator("header.top")).to_contain_text(login)


def create_bot(page: Page, base_url: str, login: str, *, owner: str = "") -> None:
    """Create a bot account on the admin page (the page must be signed in as an instance admin)."""
    page.goto(f"{base_url}/admin")
    form = page.locator("form[action='/admin/accounts']")
    form.get_by_label("Login", exact=True).fill(login)
    form.get_by_label("Kind", exact=True).select_option("bot")
    if owner:
        form.get_by_label("Responsible person").fill(owner)
    form.get_by_role("button", name="Create", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text(f"bot {login} created")
    expect(page.locator("#accounts")).to_contain_text(login)


def create_repo(
    page: Page,
    base_url: str,
    name: str,
    *,
    description: str = "",
    visibility: Visibility = "private",
    readme: bool = True,
) -> str:
    """Create a repository through the new-repository form; returns its full name (`owner/name`)
    and leaves the page on the repository's home."""
    page.goto(f"{base_url}/")
    page.get_by_role("link", name="New repository").click()
    expect(page.get_by_role("heading", name="New repository")).to_be_visible()
    page.get_by_label("Name", exact=True).fill(name)
    if description:
        page.get_by_label("Description", exact=True).fill(description)
    page.get_by_label("Visibility", exact=True).select_option(visibility)
    page.get_by_label("Start with a README").set_checked(readme)
    page.get_by_role("button", name="Create repository").click()
    expect(page).to_have_url(re.compile(rf"^{re.escape(base_url)}/[^/]+/{re.escape(name)}$"))
    full_name = page.url[len(base_url) + 1 :]
    expect(page.locator(".repo-head h1")).to_contain_text(name)
    if readme:
        expect(page.locator("#readme")).to_be_visible()
    return full_name


def add_collaborator(page: Page, base_url: str, full_name: str, login: str, role: Role = "write") -> None:
    """Grant a role (or change it) on the repository's settings page."""
    page.goto(f"{base_url}/{full_name}/settings/")
    form = page.locator(f"form[action='/{full_name}/settings/collaborators']")
    form.get_by_label("Login", exact=True).fill(login)
    form.get_by_label("Role", exact=True).select_option(role)
    form.get_by_role("button", name="Apply").click()
    expect(page.locator("#collaborators tr", has_text=login)).to_contain_text(role)


def remove_collaborator(page: Page, base_url: str, full_name: str, login: str) -> None:
    """Remove a collaborator with the Remove button of its row, confirmed on the page it opens."""
    page.goto(f"{base_url}/{full_name}/settings/")
    page.get_by_role("link", name=f"Remove collaborator {login}").click()
    expect(page.get_by_role("heading", name=f"Remove {login} from {full_name}?")).to_be_visible()
    page.get_by_role("button", name="Remove collaborator").click()
    expect(page.get_by_role("status")).to_contain_text("Collaborator removed.")
    expect(page.locator("#collaborators tr", has_text=login)).to_have_count(0)


def start_task(
    page: Page,
    base_url: str,
    full_name: str,
    *,
    goal: str,
    agent: str,
    runtime: Runtime,
    command: str = "",
    base: str = "",
) -> int:
    """Start a task through the repository's start form; returns the task number, with the page on
    the task page. `command` is for the `command` runtime (it runs with `bash -lc` in the sandbox)."""
    page.goto(f"{base_url}/{full_name}/tasks/")
    form = page.locator(f"form[action='/{full_name}/tasks/']")
    # The agent is a choice among the bots that may work on the repository.
    form.get_by_label(re.compile(r"^\s*Goal")).fill(goal)
    form.get_by_label(re.compile(r"^\s*Agent")).select_option(agent)
    form.locator(f"input[name=runtime][value='{runtime}']").check()  # one radio per runtime
    if command:
        form.get_by_label(re.compile(r"^\s*Command")).fill(command)
    if base:
        form.get_by_label(re.compile(r"^\s*Base branch")).fill(base)
    form.get_by_role("button", name="Start").click()
    expect(page).to_have_url(re.compile(rf"/{re.escape(full_name)}/tasks/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def start_command_task(
    page: Page,
    base_url: str,
    full_name: str,
    *,
    goal: str,
    agent: str,
    command: str,
    base: str = "",
) -> int:
    """Start a `command`-runtime task through the repository's start form (the command runs with
    `bash -lc` in the sandbox); returns the task number, with the page on the task page."""
    return start_task(page, base_url, full_name, goal=goal, agent=agent, runtime="command", command=command, base=base)


def task_state(page: Page) -> Locator:
    """The state badge in the task page's heading (its text is the state with spaces, e.g.
    `awaiting review`, or `queued · #1 in queue`)."""
    return page.locator("h1 span.badge[class*='state-']")


def expect_task_state(page: Page, state: str, *, timeout_ms: float = 120_000) -> None:
    """Wait until the task page shows `state` (e.g. "awaiting review"). The badge is not live: the
    page reloads itself when the transcript stream ends, so this waits across that reload."""
    expect(task_state(page)).to_have_text(re.compile(rf"^\s*{re.escape(state)}\b"), timeout=timeout_ms)


def transcript(page: Page) -> Locator:
    """The whole transcript (system lines, prompts, output, ...)."""
    return page.locator("#transcript")


def transcript_output(page: Page) -> Locator:
    """The transcript's stdout/stderr chunks, one element each, whether rendered or streamed."""
    return page.locator("#transcript .ev-stdout .chunk, #transcript .ev-stderr .chunk")


def mark_page(page: Page) -> None:
    """Tag the loaded document, so `was_reloaded` can tell whether it was replaced since."""
    page.evaluate(f"window.{_MARK} = true")


def was_reloaded(page: Page) -> bool:
    return not page.evaluate(f"window.{_MARK} === true")


def runs_table(page: Page) -> Locator:
    """The task page's runs, one row per run (number, kind, state, ...)."""
    return page.locator("table.list tbody tr")


# --- policy hooks and approvals ------------------------------------------------------------------


def add_policy_hook(
    page: Page,
    base_url: str,
    full_name: str,
    url: str,
    events: list[str],
    *,
    failure_policy: FailurePolicy = "closed",
) -> None:
    """Register a policy endpoint for the repository on its webhooks settings page (the consumer's
    host must be allowed: settings `webhooks_allowed_hosts`); leaves the page on the new endpoint."""
    page.goto(f"{base_url}/{full_name}/settings/hooks/")
    page.get_by_label("Payload URL").fill(url)
    page.get_by_label("Kind", exact=True).select_option("policy")
    policy_events = page.locator("fieldset fieldset", has_text="Policy events")
    for event in events:
        policy_events.get_by_label(event, exact=True).check()
    page.get_by_label("When a policy endpoint fails").select_option(failure_policy)
    page.get_by_role("button", name="Create endpoint").click()
    expect(page.get_by_role("status")).to_contain_text("Endpoint created.")
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"policy endpoint {url}")


def approval_card(page: Page) -> Locator:
    """The task page's card of a tool call waiting for a person (section#approval)."""
    return page.locator("section#approval")


def decide_approval(page: Page, decision: Literal["approve", "deny"], *, reason: str = "") -> None:
    """Approve ("Approve and run") or deny the parked call on the task page; returns once the task
    page shows the call decided (the card gone)."""
    card = approval_card(page)
    if reason:
        card.get_by_label(re.compile(r"^\s*Reason")).fill(reason)
    card.get_by_role("button", name="Approve and run" if decision == "approve" else "Deny").click()
    expect(approval_card(page)).to_have_count(0)


# --- reviews and merging -------------------------------------------------------------------------


def open_review(page: Page) -> None:
    """Follow the task page's link to its review, which is its pull request's Files changed tab
    (the task's review URL redirects there)."""
    page.locator("#review-link").click()
    expect(page).to_have_url(re.compile(r"/pull/\d+/files$"))
    expect(page.locator("#task-work")).to_be_visible()


def comment_on_line(page: Page, path: str, line: int, body: str) -> None:
    """On a task's pull request page, open the comment form of a diff line (`+` beside it), write
    `body` and post it as a comment review; returns once the comment shows under that line."""
    summary = page.get_by_label(f"Comment on {path} line {line}", exact=True)
    summary.click()
    form = page.locator("details.add-comment[open] form")
    form.get_by_label(f"Comment on {path} line {line} (markdown)").fill(body)
    form.get_by_role("button", name="Comment now", exact=True).click()
    expect(page).to_have_url(re.compile(r"/pull/\d+#review-\d+$"))
    expect(page.locator("table.diff .inline-comment", has_text=body)).to_be_visible()


_VERDICT_LABELS = {
    "comment": re.compile(r"^\s*Comment\s*$"),
    "approve": re.compile(r"^\s*Approve\s*$"),
    "request_changes": re.compile(r"^\s*Request changes\b"),
}


def submit_review(page: Page, verdict: Verdict, body: str = "") -> None:
    """Submit the review form of a task's pull request page; every verdict comes back to the page,
    at the new review (a change request's follow-up run shows on the task page)."""
    form = page.locator("#review-form")
    if body:
        form.get_by_label("Review (markdown)").fill(body)
    form.get_by_role("radio", name=_VERDICT_LABELS[verdict]).check()
    form.get_by_role("button", name="Submit review").click()
    expect(page).to_have_url(re.compile(r"/pull/\d+#review-\d+$"))
    expect(page.locator("#pull-error")).to_have_count(0)


def merge_button(page: Page) -> Locator:
    """The pull request page's "Merge into <base>" button (disabled while a merge rule blocks)."""
    return page.locator("#merge-form").get_by_role("button", name=re.compile(r"^Merge into "))


def merge_blockers(page: Page) -> Locator:
    """What keeps the task from merging, one item each (none when it may merge)."""
    return page.locator("#merge ul.blockers li")


def merge_task(page: Page, strategy: Strategy = "merge") -> str:
    """Merge from the pull request page; returns the merge commit's full sha (from the link to it)."""
    page.locator("#merge-form").get_by_label("Strategy").select_option(strategy)
    merge_button(page).click()
    merged = page.locator("#merged")
    expect(merged).to_be_visible()
    href = merged.get_by_role("link").get_attribute("href") or ""
    match = re.search(r"/commit/([0-9a-f]{40})$", href)
    assert match, f"no merge commit link in #merged: {href!r}"
    return match.group(1)
