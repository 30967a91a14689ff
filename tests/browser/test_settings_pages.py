"""Settings and the first hour in a real browser: a generated password is changed before anything
else. One server for the module (no tasks run here, so no worker and no sandbox)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, serve_forge
from tests.support.browser_ui import sign_in

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeServer]:
    with serve_forge(tmp_path_factory.mktemp("settings-pages"), {"run_worker": False}) as server:
        yield server


def create_user(page: Page, site: ForgeServer, login: str) -> str:
    """Create a person on the admin page (signed in as the admin); returns the generated password."""
    page.goto(site.at("/admin/"))
    form = page.locator("form[action='/admin/accounts']")
    form.get_by_label("Login", exact=True).fill(login)
    form.get_by_role("button", name="Create", exact=True).click()
    expect(page.get_by_role("status").first).to_contain_text(f"user {login} created")
    expect(page.locator("#accounts tr", has_text=login)).to_contain_text("must change password")
    return page.locator("#new-password").inner_text().strip()


def test_a_generated_password_is_changed_at_first_sign_in(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        generated = create_user(page, site, "newbie")
        page.context.clear_cookies()

        sign_in(page, site.url, "newbie", generated)
        expect(page).to_have_url(site.at("/settings/password"))
        required = page.locator("#password-required")
        expect(required).to_contain_text("Choose your own password before you go on")
        expect(required).to_contain_text("generated")
        check_page(page, artifacts_dir, "settings-password-required")
        # Every other page brings the person back, and says where they were going.
        page.get_by_role("navigation", name="Main", exact=True).get_by_role("link", name="Repositories").click()
        expect(page).to_have_url(site.at("/settings/password?next=%2Frepos"))
        expect(required).to_be_visible()

        new = "newbie's own password"
        page.get_by_label("Current password").fill(generated)
        page.get_by_label("New password", exact=True).fill(new)
        page.get_by_label("New password again").fill(new)
        page.get_by_role("button", name="Change password").click()
        expect(page.locator("#password-notice")).to_contain_text("Password changed")
        expect(required).to_have_count(0)
        page.get_by_role("link", name="Continue").click()
        expect(page).to_have_url(site.at("/repos"))
        expect(page.get_by_role("heading", level=1)).to_contain_text("Repositories")
        page.goto(site.at("/"))
        expect(page).to_have_url(site.at("/"))

    page.context.clear_cookies()
    sign_in(page, site.url, "newbie", new)
    expect(page).to_have_url(site.at("/"))  # no longer asked
