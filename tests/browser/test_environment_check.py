"""The settings page's "Check environment" in a real browser, with the real engine: a repository admin
declares an environment (`echo ok`, on the sandbox image) and checks it. With no bot that may work
on the repository the check is refused beside "Run as", the command kept; with one, the check (a
command task, no agent) builds the environment and runs the smoke command, and the page shows the
outcome when it ends without being reloaded: passed with exit code 0 and the output, then a
failing command's exit code with the tail of a long output folded, then a failing setup's log.
The page passes an axe scan at desktop and phone width. A write collaborator can
neither see the section nor start a check."""

import re
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.a11y import check_page
from tests.support.browser import ForgeServer, make_user
from tests.support.browser_ui import add_collaborator, create_bot, create_repo, mark_page, sign_in, was_reloaded

pytestmark = [pytest.mark.browser, pytest.mark.docker]

DECLARATION = "image: sandbox\nsetup: echo ok\n"
BROKEN = "image: sandbox\nsetup: echo broken-setup; exit 4\n"
PASSWORD = "correct horse battery"
CHECK_TIMEOUT_MS = 240_000  # the first check builds the environment


@pytest.fixture
def site(forge: ForgeServer, docker_client: docker.DockerClient) -> Iterator[ForgeServer]:
    """The live server with its worker; the environment images its checks built go afterwards."""
    yield forge
    label = f"forgehand.instance={forge.settings.instance_id}"
    for image in docker_client.images.list(filters={"label": label}):
        if any(tag.startswith("forgehand-env:") for tag in image.tags):
            docker_client.images.remove(image.id, force=True)


def check(page: Page, command: str) -> None:
    form = page.locator("#environment-check-form")
    form.get_by_label("Smoke command", exact=True).fill(command)
    form.get_by_role("button", name="Check environment", exact=True).click()


def wait_for_outcome(page: Page, outcome: str) -> None:
    """The outcome badge of the check shown, once its poll brought the check's end (no reload)."""
    expect(page.locator("#environment-check-outcome")).to_have_text(outcome, timeout=CHECK_TIMEOUT_MS)


def test_a_repository_admin_checks_the_environment_from_the_settings_page(
    page: Page, browser: Browser, site: ForgeServer, artifacts_dir: Path
) -> None:
    sign_in(page, site.url, site.admin_login, site.admin_password)
    full_name = create_repo(page, site.url, "checked")
    settings = site.at(f"/{full_name}/settings/tasks/")
    page.goto(settings)
    section = page.locator("#environment")
    section.get_by_label("Declaration (YAML)").fill(DECLARATION)
    section.get_by_role("button", name="Set this environment", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Environment saved.")

    # No bot may work on the repository yet: refused beside "Run as", the command kept.
    check(page, "echo smoke-ok")
    form = page.locator("#environment-check-form")
    expect(form.get_by_role("alert")).to_contain_text("no bot may work on this repository")
    expect(form.get_by_label("Run as", exact=True)).to_have_attribute("aria-invalid", "true")
    expect(form.get_by_label("Smoke command", exact=True)).to_have_value("echo smoke-ok")
    expect(page.locator("#environment-check")).to_have_count(0)

    create_bot(page, site.url, "checker")
    add_collaborator(page, site.url, full_name, "checker", "write")
    page.goto(settings)
    expect(page.locator("#environment-check-form").get_by_label("Run as", exact=True)).to_contain_text("checker")
    check(page, "echo smoke-ok; echo smoke-err >&2; test -d /opt/env")
    expect(page).to_have_url(re.compile(r"/settings/tasks/\?check=1#environment-check$"))
    result = page.locator("#environment-check")
    expect(result).to_contain_text("echo smoke-ok; echo smoke-err >&2; test -d /opt/env")
    mark_page(page)
    wait_for_outcome(page, "passed")
    assert not was_reloaded(page), "the outcome came with a reload, not the poll"
    expect(page.locator("#environment-check-result")).to_contain_text("exit code 0")
    log = page.locator("#environment-check-log")
    expect(log).to_contain_text("smoke-ok")
    expect(log).to_contain_text("smoke-err")  # stderr too
    expect(log.locator("details")).to_have_count(0)  # a short output is not folded
    expect(result.get_by_role("link", name="#1")).to_have_attribute("href", f"/{full_name}/tasks/1")
    expect(page.locator("#environment-check-form").get_by_label("Smoke command")).to_have_value(
        "echo smoke-ok; echo smoke-err >&2; test -d /opt/env"
    )
    page.screenshot(path=str(artifacts_dir / "environment-check-passed.png"), full_page=True)

    # The check is a task like any other: its page has the build and the command's output.
    page.goto(site.at(f"/{full_name}/tasks/1"))
    expect(page.get_by_role("heading", level=1)).to_contain_text("#1 Check environment")
    expect(page.locator("#transcript")).to_contain_text("smoke-ok")

    # A failing command: its exit code, and the tail of a long output, folded.
    page.goto(settings)
    check(page, "seq 1 60; echo going-wrong; exit 3")
    expect(page).to_have_url(re.compile(r"\?check=2#environment-check$"))
    wait_for_outcome(page, "failed")
    expect(page.locator("#environment-check-result")).to_contain_text("exit code 3")
    folded = page.locator("details#environment-check-log")
    expect(folded).not_to_have_attribute("open", "")
    expect(folded.locator("summary")).to_contain_text("The last 40 lines of the command's output")
    folded.locator("summary").click()
    tail = folded.locator("pre")
    expect(tail).to_contain_text("going-wrong")
    lines = tail.inner_text().splitlines()
    assert lines[0] == "22" and lines[-2:] == ["60", "going-wrong"], lines
    page.screenshot(path=str(artifacts_dir / "environment-check-failed.png"), full_page=True)

    # A setup that fails: the check fails before the command runs, with the setup's log.
    page.locator("#environment").get_by_label("Declaration (YAML)").fill(BROKEN)
    page.locator("#environment").get_by_role("button", name="Set this environment", exact=True).click()
    expect(page.get_by_role("status")).to_contain_text("Environment saved.")
    check(page, "echo never-runs")
    expect(page).to_have_url(re.compile(r"\?check=3#environment-check$"))
    wait_for_outcome(page, "failed")
    expect(page.locator("#environment-check-result")).to_contain_text("before the smoke command ran")
    expect(page.locator("#environment-check-result")).to_contain_text("the environment's setup failed (exit 4)")
    setup_log = page.locator("#environment-check-log")
    expect(setup_log).to_contain_text("The setup's log")
    expect(setup_log).to_contain_text("broken-setup")
    expect(setup_log).not_to_contain_text("never-runs")
    check_page(page, artifacts_dir, "environment-check-setup-failed")
    page.locator("#environment").screenshot(path=str(artifacts_dir / "environment-check-section.png"))

    # A write collaborator: no settings page, and a check refused (with her own CSRF token).
    make_user(site, "wren")
    add_collaborator(page, site.url, full_name, "wren", "write")
    context = browser.new_context(locale="en-US")
    try:
        wren = context.new_page()
        sign_in(wren, site.url, "wren", PASSWORD)
        response = wren.goto(settings)
        assert response is not None
        assert response.status in (403, 404), response.status
        csrf = wren.locator("input[name=csrf_token]").first.input_value()
        refused = wren.request.post(
            site.at(f"/{full_name}/settings/tasks/environment/check"),
            form={"csrf_token": csrf, "command": "true"},
            max_redirects=0,
        )
        assert refused.status in (403, 404), refused.status
        outcome = wren.request.get(site.at(f"/{full_name}/settings/tasks/environment/check/1"))
        assert outcome.status in (403, 404), outcome.status
    finally:
        context.close()
    tasks = page.request.get(site.at(f"/api/v1/repos/{full_name}/tasks")).json()
    assert [t["number"] for t in tasks] == [3, 2, 1], tasks  # no fourth check was started
