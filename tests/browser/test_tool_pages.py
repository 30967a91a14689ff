"""A repository's custom tools in a real browser, with the real engine (docs/tools.md): its admin
opens Settings > Tools and makes a tool. A parameter schema that cannot be is said as it is typed
(the live check), and the server refuses the form the same way, everything typed kept; fixed, the
tool is made (version 1, a draft). A change makes version 2, the page shows the diff, version 2
is activated and version 1 restored (version 3); a test run of version 1 (`echo hi`) runs in a
container and its output is on the page. The form and the tool page pass an axe scan at desktop
and phone width. The admin area links to the instance's tools, a list of their own."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import check_page
from tests.support.browser import ForgeServer
from tests.support.browser_ui import create_repo, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.docker]

BAD_SCHEMA = '{"type": "object", "properties": {"who": {"type": "object"}}}'
GOOD_SCHEMA = '{"type": "object", "properties": {}}'
RUN_TIMEOUT_MS = 180_000  # a test run starts a fresh container


def test_a_repository_admin_makes_versions_of_a_tool_and_test_runs_one(
    page: Page, forge: ForgeServer, artifacts_dir: Path
) -> None:
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    full_name = create_repo(page, forge.url, "tooled")
    page.goto(forge.at(f"/{full_name}/settings/"))
    page.get_by_role("navigation", name="Repository settings").get_by_role("link", name="Tools").click()
    expect(page.get_by_role("heading", name="Custom tools")).to_be_visible()
    expect(page.locator("#no-tools")).to_be_visible()
    page.get_by_role("link", name="New tool").click()

    # A schema that cannot be: said as it is typed, beside the field.
    form = page.locator("#tool-form")
    form.get_by_label("Name", exact=True).fill("say_hi")
    form.get_by_label("Description", exact=True).fill("Says hi")
    parameters = form.get_by_label("Parameters (JSON)")
    parameters.fill(BAD_SCHEMA)
    live = page.locator("#parameters-check")
    expect(live).to_have_attribute("aria-live", "polite")
    expect(live).to_contain_text("parameters.properties.who: type 'object' is not allowed")
    expect(parameters).to_have_attribute("aria-invalid", "true")
    form.get_by_label("Script", exact=True).fill("echo hi")
    check_page(page, artifacts_dir, "tool-form")

    # Saved anyway: the server refuses it the same way, everything typed kept.
    page.get_by_role("button", name="Create tool").click()
    expect(page.locator("#tool-form-error")).to_contain_text("parameters.properties.who")
    expect(page.locator("#parameters-error")).to_contain_text("type 'object' is not allowed")
    expect(form.get_by_label("Name", exact=True)).to_have_value("say_hi")
    expect(form.get_by_label("Description", exact=True)).to_have_value("Says hi")
    expect(form.get_by_label("Script", exact=True)).to_have_value("echo hi")
    expect(parameters).to_have_value(BAD_SCHEMA)

    parameters.fill(GOOD_SCHEMA)
    expect(live).to_have_text("Valid: the tool takes no inputs.")
    page.get_by_role("button", name="Create tool").click()
    expect(page.get_by_role("heading", name="custom_say_hi")).to_be_visible()
    expect(page.locator("#tool-notice")).to_contain_text("Version 1 is a draft")
    tool_url = page.url.split("?")[0]

    # A change: version 2, a draft; the diff between them.
    page.get_by_role("link", name="Change (a new version)").click()
    page.locator("#tool-form").get_by_label("Script", exact=True).fill("echo hi\necho version two")
    page.get_by_role("button", name="Make a new version").click()
    expect(page.locator("#tool-notice")).to_contain_text("Version 2 made, a draft")
    expect(page.locator("#diff-heading")).to_have_text("From version 1 to version 2")
    expect(page.locator("#diff-script .dadd")).to_have_text(["+echo version two"])

    page.get_by_role("button", name="Activate version 2").click()
    expect(page.locator("#tool-notice")).to_contain_text("Version 2 is active")
    expect(page.locator("#active-version")).to_have_text("2")
    page.get_by_role("button", name="Restore version 1").click()
    expect(page.locator("#tool-notice")).to_contain_text("Version 3 restores version 1")
    expect(page.locator("#versions tbody tr")).to_have_count(3)
    expect(page.locator("#active-version")).to_have_text("2")  # a restored version is a draft

    # A test run of version 1: run in a container, then shown with its output.
    test_run = page.locator("#test-run-form")
    test_run.get_by_label("Version", exact=True).select_option(label="version 1 (draft)")
    test_run.get_by_label("Inputs (JSON)").fill("{}")
    with page.expect_navigation(url=re.compile(r"\?run=\d+"), timeout=RUN_TIMEOUT_MS):
        page.get_by_role("button", name="Test run").click()
    run = page.locator("#runs tr.shown")
    expect(run).to_contain_text("succeeded")
    expect(run).to_contain_text("test run")
    expect(run.locator("td").nth(2)).to_have_text("1")  # the version it ran
    output = run.locator("details.run-output")
    expect(output).to_have_attribute("open", "")
    expect(output.locator("pre")).to_have_text("hi\n")
    assert page.url.startswith(tool_url)
    check_page(page, artifacts_dir, "tool-page")

    # The instance's tools: the admin area's own list (the repository's tool is not there).
    page.get_by_role("navigation", name="Main", exact=True).get_by_role("link", name="Admin").click()
    page.get_by_role("list", name="Administration").get_by_role("link", name="Tools").click()
    expect(page).to_have_url(forge.at("/admin/tools/"))
    expect(page.get_by_role("heading", name="Custom tools")).to_be_visible()
    expect(page.locator("#no-tools")).to_be_visible()
