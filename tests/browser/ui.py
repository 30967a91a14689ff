"""What a person does in the web UI, as Playwright steps (sync API). Each helper drives the real
forms the way a user would (labels, buttons), then waits for what the user would see next, so a
test that calls it fails at the step that broke."""

import re
from typing import Literal

from playwright.sync_api import Locator, Page, expect

Visibility = Literal["private", "internal", "public"]
Role = Literal["read", "write", "admin", "remove"]

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
    """Grant (or with `remove`, take away) a role on the repository's settings page."""
    page.goto(f"{base_url}/{full_name}/settings/")
    form = page.locator(f"form[action='/{full_name}/settings/collaborators']")
    form.get_by_label("Login", exact=True).fill(login)
    form.get_by_label("Role", exact=True).select_option(role)
    form.get_by_role("button", name="Apply").click()
    row = page.locator("#collaborators tr", has_text=login)
    if role == "remove":
        expect(row).to_have_count(0)
    else:
        expect(row).to_contain_text(role)


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
    page.goto(f"{base_url}/{full_name}/tasks/")
    form = page.locator(f"form[action='/{full_name}/tasks/']")
    # The form's controls have no ids: their labels wrap them (the runtime label's text includes
    # its options, "command" among them, hence the anchored patterns).
    form.get_by_label(re.compile(r"^\s*Goal")).fill(goal)
    form.get_by_label(re.compile(r"^\s*Agent")).fill(agent)
    form.get_by_label(re.compile(r"^\s*Runtime")).select_option("command")
    form.get_by_label(re.compile(r"^\s*Command")).fill(command)
    if base:
        form.get_by_label(re.compile(r"^\s*Base branch")).fill(base)
    form.get_by_role("button", name="Start").click()
    expect(page).to_have_url(re.compile(rf"/{re.escape(full_name)}/tasks/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


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
    return page.locator("#transcript .ev-stdout pre, #transcript .ev-stderr pre")


def mark_page(page: Page) -> None:
    """Tag the loaded document, so `was_reloaded` can tell whether it was replaced since."""
    page.evaluate(f"window.{_MARK} = true")


def was_reloaded(page: Page) -> bool:
    return not page.evaluate(f"window.{_MARK} === true")
