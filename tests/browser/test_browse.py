"""Browsing a repository in a real browser, as a GitHub or Gitea user would: the home with its
README and last commits, a folder, a file, blame, the log, a file's history, a commit in unified
and split layout, branches, and an empty repository's setup steps. Each page is checked at desktop
and phone width (axe scan, no horizontal overflow, screenshots in the artefact directory) with no
request leaving the instance; the ref switcher is used with the keyboard alone."""

from pathlib import Path

import httpx
from playwright.sync_api import ElementHandle, Page, expect

from forge.git.names import repo_path
from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browse_repo import History, build_history, push_to
from tests.support.browser import ForgeServer
from tests.support.browser_ui import create_repo


def _pushed(page: Page, forge: ForgeServer, tmp_path: Path) -> tuple[str, History]:
    full_name = create_repo(page, forge.url, "tour", readme=False)
    owner, name = full_name.split("/")
    history = build_history(tmp_path / "work")
    push_to(history.work, repo_path(forge.settings.data_dir / "repos", owner, name))
    return full_name, history


def _report_checks(page: Page, forge: ForgeServer, full: str, sha: str) -> None:
    """Two statuses on `sha`, as a CI job posts them with a token made on the tokens page."""
    page.goto(forge.at("/settings/tokens/"))
    page.get_by_label("Name", exact=True).fill("ci")
    page.get_by_label("repo:write", exact=True).check()
    page.get_by_role("button", name="Create token").click()
    token = page.locator("#new-token").inner_text().strip()
    for body in (
        {"state": "success", "context": "ci/build", "target_url": "https://ci.example/1"},
        {"state": "failure", "context": "lint", "description": "2 problems"},
    ):
        r = httpx.post(
            forge.at(f"/api/v1/repos/{full}/statuses/{sha}"),
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        assert r.status_code == 201, r.text


def _tab_to(page: Page, element: ElementHandle) -> None:
    """Press Tab until ``element`` has the focus (fails after 60 presses)."""
    for _ in range(60):
        page.keyboard.press("Tab")
        if element.evaluate("el => el === document.activeElement"):
            return
    raise AssertionError("Tab never reached the element")


def test_every_browsing_page_reads_well(
    admin_page: Page, forge: ForgeServer, tmp_path: Path, artifacts_dir: Path
) -> None:
    """Over 30 s: one walk over every browsing page (tree, blob, blame, commits, compare,
    branches) at two widths with screenshots, in one browser page rather than a test per page."""
    page = admin_page
    empty = create_repo(page, forge.url, "blank", readme=False)
    with no_foreign_requests(page):
        page.goto(forge.at(f"/{empty}"))
        setup = page.locator("#setup")
        expect(setup).to_contain_text(f"git remote add origin {forge.url}/{empty}.git")
        check_page(page, artifacts_dir, "browse-empty")

    full, history = _pushed(page, forge, tmp_path)
    with no_foreign_requests(page):
        page.goto(forge.at(f"/{full}"))
        expect(page.locator("#ref-switcher summary")).to_contain_text("main")
        row = page.locator("#tree tr", has_text="LICENSE")
        expect(row.get_by_role("link", name="Initial import")).to_be_visible()
        expect(row.locator("time")).to_have_attribute("datetime", "2024-01-01T00:00:00+00:00")
        expect(page.locator("#readme h1")).to_have_text("Browse me")
        assert page.evaluate("() => window.__owned") is None  # the README's script never ran
        check_page(page, artifacts_dir, "browse-home")

        page.locator("#tree").get_by_role("link", name="src", exact=True).click()
        page.locator("#tree").get_by_role("link", name="lib", exact=True).click()
        crumbs = page.get_by_role("navigation", name="Path")
        expect(crumbs.locator("[aria-current=page]")).to_have_text("lib")
        crumbs.get_by_role("link", name="src").click()
        expect(page).to_have_url(forge.at(f"/{full}/tree/src"))
        check_page(page, artifacts_dir, "browse-folder")

        page.locator("#tree").get_by_role("link", name="app.py").click()
        expect(page.locator("#code")).to_contain_text("hello, world")
        check_page(page, artifacts_dir, "browse-file")

        page.get_by_role("link", name="Blame").click()
        expect(page.locator("#blame")).to_contain_text("Greet the world")
        check_page(page, artifacts_dir, "browse-blame")

        page.get_by_role("link", name="History").last.click()
        expect(page.locator("#commits tr")).to_have_count(3)
        check_page(page, artifacts_dir, "browse-history")

        page.goto(forge.at(f"/{full}/commits"))
        newest = page.locator("#commits tr").first
        expect(newest).to_contain_text("Add assets")
        expect(newest.get_by_role("link", name=history.big_files[:10])).to_have_attribute(
            "href", f"/{full}/commit/{history.big_files}"
        )
        check_page(page, artifacts_dir, "browse-log")

        _report_checks(page, forge, full, history.feature)
        page.goto(forge.at(f"/{full}/commit/{history.feature}"))
        expect(page.locator("#parents a")).to_have_count(1)
        checks = page.locator("section.checks")
        expect(checks.get_by_role("heading")).to_have_text("Checks: some failed")
        expect(checks.get_by_role("link", name="Details of ci/build")).to_have_attribute("href", "https://ci.example/1")
        page.get_by_role("navigation", name="Changed files").get_by_role("link", name="src/app.py").click()
        expect(page).to_have_url(forge.at(f"/{full}/commit/{history.feature}#diff-1"))
        expect(page.locator("table.diff.unified tr.add")).to_contain_text("hello, world")
        check_page(page, artifacts_dir, "browse-commit-unified")
        page.get_by_role("link", name="Split").click()
        expect(page.locator("table.diff.split td.src.add")).to_contain_text("hello, world")
        check_page(page, artifacts_dir, "browse-commit-split")

        page.goto(forge.at(f"/{full}/branches"))
        expect(page.locator("#tags")).to_contain_text("v1.0")
        check_page(page, artifacts_dir, "browse-branches")

        page.goto(forge.at(f"/{full}/compare/v1.0...main"))
        expect(page.get_by_role("navigation", name="Changed files")).to_contain_text("src/app.py")
        check_page(page, artifacts_dir, "browse-compare")


def test_ref_switcher_by_keyboard(admin_page: Page, forge: ForgeServer, tmp_path: Path) -> None:
    page = admin_page
    full, _ = _pushed(page, forge, tmp_path)
    page.goto(forge.at(f"/{full}/tree/src"))
    summary = page.locator("#ref-switcher summary")
    _tab_to(page, summary.element_handle())
    page.keyboard.press("Enter")
    expect(page.locator("#ref-switcher")).to_have_attribute("open", "")
    target = page.locator("#ref-switcher").get_by_role("link", name="v1.0")
    _tab_to(page, target.element_handle())
    page.keyboard.press("Enter")
    expect(page).to_have_url(forge.at(f"/{full}/tree/src?ref=v1.0"))
    expect(page.locator("#ref-switcher summary")).to_contain_text("v1.0")
    expect(page.locator("#tree tr", has_text="app.py").get_by_role("link", name="Say hello")).to_be_visible()
