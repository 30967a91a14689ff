"""The account, tokens, admin, profile, error and API-reference pages in a real browser: each at
desktop and phone width (screenshots in the artefact directory), an axe scan of each (no serious
or critical violations), nothing requested from another origin, the phone menu, and keyboard-only
password change and token creation and revocation. One server for the module (no tasks run here,
so no worker and no sandbox)."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import assert_accessible, check_page, no_foreign_requests, phone_width
from tests.support.browser import ForgeServer, make_user, serve_forge
from tests.support.browser_ui import sign_in

pytestmark = pytest.mark.browser
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeServer]:
    with serve_forge(tmp_path_factory.mktemp("account-pages"), {"run_worker": False}) as server:
        yield server


def press_tab_until_focused(page: Page, selector: str, *, limit: int = 60) -> None:
    """Tab forward (the keyboard only) until the element `selector` has the focus."""
    target = page.locator(selector)
    for _ in range(limit):
        page.keyboard.press("Tab")
        if target.evaluate("el => el === document.activeElement"):
            return
    raise AssertionError(f"Tab never reached {selector}")


def type_password_change(page: Page, current: str, new: str) -> None:
    """Fill the password form from the keyboard (Tab between its fields) and send it with Enter."""
    press_tab_until_focused(page, "#current_password")
    for i, text in enumerate((current, new, new)):
        if i:
            page.keyboard.press("Tab")
        page.keyboard.type(text)
    page.keyboard.press("Enter")


def test_every_account_page_at_desktop_and_phone(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    """Every account page at a desktop and a phone viewport, each with an accessibility scan and a
    screenshot: about twenty page loads with axe, so 30-40 s under the parallel suite. One person's
    pages, so they share one server instead of one per page."""
    make_user(site, "pia")
    with no_foreign_requests(page, site.url):
        page.goto(site.at("/signin"))
        check_page(page, artifacts_dir, "account-signin")
        sign_in(page, site.url, site.admin_login, site.admin_password)
        page.goto(site.at("/settings/tokens/"))
        page.get_by_label("Name", exact=True).fill("laptop")
        page.get_by_label("repo:read", exact=True).check()
        page.get_by_role("button", name="Create token").click()
        expect(page.locator("#new-token")).to_have_text(re.compile(r"^fh_\w{40}$"))
        for name, path in (
            ("account-tokens-created", None),  # the page the creation redirected to
            ("account-dashboard", "/"),
            ("account-tokens", "/settings/tokens/"),
            ("account-settings-profile", "/settings"),
            ("account-settings-password", "/settings/password"),
            ("account-settings-model-access", "/settings/model-keys/"),
            ("account-profile", f"/{site.admin_login}"),
            ("account-profile-other", "/pia"),
            ("account-admin", "/admin/"),
            ("account-audit", "/admin/audit"),
            ("account-admin-hooks", "/admin/hooks/"),
            ("account-error-404", "/nobody-here"),
            ("account-error-404-deep", "/a/b/c/d/e/f/g/h"),
        ):
            if path is not None:
                page.goto(site.at(path))
            check_page(page, artifacts_dir, name)
            expect(page.locator("header.top")).to_contain_text(site.admin_login)  # error pages too
        page.goto(site.at("/settings/tokens/"))
        page.get_by_role("link", name="Revoke token laptop").click()
        expect(page.get_by_role("heading", name="Revoke token laptop?")).to_be_visible()
        check_page(page, artifacts_dir, "account-token-revoke")


def test_a_forbidden_page_keeps_the_header(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    make_user(site, "quinn")
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, "quinn", PASSWORD)
        response = page.goto(site.at("/admin/"))
        assert response is not None and response.status == 403
        expect(page.get_by_role("heading", level=1)).to_contain_text("403")
        expect(page.locator("header.top")).to_contain_text("quinn")
        expect(page.get_by_role("link", name="Admin")).to_have_count(0)  # not an admin: no such link
        check_page(page, artifacts_dir, "account-error-403")


def test_nav_links_admin_and_the_api_reference(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    """The admin navigation, the audit log and the API reference, which Swagger UI renders from
    the whole OpenAPI document (the largest page there is), one section opened, then scanned at
    desktop and phone widths with full-page screenshots (two axe scans of that page are most of
    the time this takes)."""
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        nav = page.get_by_role("navigation", name="Main", exact=True)
        nav.get_by_role("link", name="Admin").click()
        admin_nav = page.get_by_role("list", name="Administration")
        for label in ("Accounts", "Instance webhooks", "Audit log"):
            expect(admin_nav.get_by_role("link", name=label)).to_be_visible()
        admin_nav.get_by_role("link", name="Audit log").click()
        expect(page.get_by_role("heading", name="Audit log")).to_be_visible()
        page.get_by_role("contentinfo").get_by_role("link", name="API reference").click()
        expect(page).to_have_url(site.at("/api/schema/swagger"))
        # Swagger UI rendered the instance's own contract, from the instance's own files.
        expect(page.locator(".swagger-ui .info .title")).to_contain_text("forgehand")
        # The sections come folded (seven of them, not 88 operations at once); opening one lists its calls.
        expect(page.locator(".opblock-summary-path")).to_have_count(0)
        page.get_by_role("heading", name=re.compile(r"^user\b")).click()
        expect(page.locator(".opblock-summary-path", has_text="/api/v1/user").first).to_be_visible()
        check_page(page, artifacts_dir, "account-api-reference")


def test_the_phone_menu_opens_by_keyboard(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    with no_foreign_requests(page, site.url), phone_width(page):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        expect(page.get_by_role("navigation", name="Main", exact=True)).to_be_hidden()
        menu = page.locator("details.menu")
        press_tab_until_focused(page, "details.menu > summary")
        page.keyboard.press("Enter")
        expect(menu).to_have_attribute("open", "")
        inner = page.get_by_role("navigation", name="Main (menu)")
        for label in ("Dashboard", "Settings", "Admin", "API"):
            expect(inner.get_by_role("link", name=label, exact=True)).to_be_visible()
        page.screenshot(path=str(artifacts_dir / "account-phone-menu-open.png"), full_page=True)
        assert_accessible(page, label="phone menu open")
        press_tab_until_focused(page, "details.menu a[href='/settings']")
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(r"/settings/profile$"))
        # On a phone the settings' side nav stacks above the section and stays usable.
        sections = page.get_by_role("navigation", name="Settings", exact=True)
        sections.get_by_role("link", name="Tokens").click()
        expect(page.get_by_role("heading", name="Personal access tokens")).to_be_visible()


def test_password_change_by_keyboard_only(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    make_user(site, "kim")
    new = "kim's much longer password"
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, "kim", PASSWORD)
        page.goto(site.at("/settings/password"))
        type_password_change(page, "not the password", new)
        expect(page.locator("#password-error")).to_contain_text("current password is wrong")
        check_page(page, artifacts_dir, "account-password-refused")
        type_password_change(page, PASSWORD, new)
        expect(page.locator("#password-notice")).to_contain_text("Password changed")
        check_page(page, artifacts_dir, "account-password-changed")
        expect(page.get_by_role("button", name="Sign out")).to_be_visible()  # this session stays
    page.context.clear_cookies()
    sign_in(page, site.url, "kim", new)


def test_token_creation_and_revocation_by_keyboard_only(page: Page, site: ForgeServer) -> None:
    make_user(site, "lee")
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, "lee", PASSWORD)
        page.goto(site.at("/settings/tokens/"))
        press_tab_until_focused(page, "#name")
        page.keyboard.type("ci runner")
        press_tab_until_focused(page, "input[name=scopes][value='tasks:read']")
        page.keyboard.press("Space")
        press_tab_until_focused(page, "form[action='/settings/tokens/'] button[type=submit]")
        page.keyboard.press("Enter")
        secret = page.locator("#new-token")
        expect(secret).to_have_text(re.compile(r"^fh_\w{40}$"))
        value = secret.inner_text()
        page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
        press_tab_until_focused(page, "button[data-copy]")
        page.keyboard.press("Enter")
        expect(page.locator("#copy-status")).to_have_text("Copied to the clipboard.")
        assert page.evaluate("navigator.clipboard.readText()") == value
        row = page.locator("#tokens tbody tr", has_text="ci runner")
        expect(row).to_contain_text(value[-8:])
        page.reload()  # POST-redirect-GET: a reload mints nothing and no longer shows the secret
        expect(page.locator("#new-token")).to_have_count(0)
        expect(page.locator("#tokens tbody tr", has_text="ci runner")).to_have_count(1)
        press_tab_until_focused(page, "a[aria-label='Revoke token ci runner']")
        page.keyboard.press("Enter")
        expect(page.get_by_role("heading", name="Revoke token ci runner?")).to_be_visible()
        # The confirm button has the focus: Enter revokes.
        expect(page.get_by_role("button", name="Revoke token")).to_be_focused()
        page.keyboard.press("Enter")
        expect(page).to_have_url(re.compile(r"/settings/tokens/?$"))
        expect(page.locator("#tokens tbody tr", has_text="ci runner")).to_have_count(0)
