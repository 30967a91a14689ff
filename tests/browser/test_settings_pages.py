"""Settings and the first hour in a real browser: a generated password is changed before anything
else; secrets shown once and the clone URL have copy buttons; no page logs a console error (the
favicon is there). One server for the module (no tasks run here, so no worker and no sandbox)."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Locator, Page, expect

from forge.accounts import accounts
from forge.db.audit import Actor
from forge.db.engine import Database
from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, run_async, serve_forge
from tests.support.browser_ui import add_collaborator, create_repo, remove_collaborator, sign_in

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeServer]:
    overrides = {"run_worker": False, "webhooks_allowed_hosts": "127.0.0.1"}
    with serve_forge(tmp_path_factory.mktemp("settings-pages"), overrides) as server:
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


def copies(page: Page, button: Locator, expected: str) -> None:
    """Press a copy button: the clipboard holds `expected` and the page says it was copied. A press
    that lands before the page's script has bound the button does nothing (as for a person, who
    presses again): the test presses again, a few times at most."""
    for _ in range(9):
        button.click()
        try:
            expect(button).to_have_attribute("title", "Copied to the clipboard.", timeout=4_000)
            break
        except AssertionError:
            continue
    expect(button).to_have_attribute("title", "Copied to the clipboard.")
    assert page.evaluate("navigator.clipboard.readText()") == expected


def test_copy_buttons_and_no_console_errors(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    """Over 30 s under the parallel suite: each copy button (clone URL, generated password, signing
    secret, new token) pressed and the clipboard read back, the console watched on every page of
    the walk, and the pages scanned by axe at two widths."""
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"{page.url}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"{page.url}: {e}"))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=site.url)
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        # The favicon every page links is served (and so is /favicon.ico, for documents without a link).
        href = page.locator("link[rel=icon]").get_attribute("href")
        assert href == "/static/favicon.svg"
        for path in (href, "/favicon.ico"):
            icon = page.request.get(site.at(path))
            assert icon.ok and icon.headers["content-type"].startswith("image/svg+xml"), path

        full_name = create_repo(page, site.url, "copyme", readme=True)
        clone = page.get_by_role("button", name="Copy the clone URL to the clipboard")
        copies(page, clone, page.locator("#clone-url").input_value())
        assert page.locator("#clone-url").input_value() == site.at(f"/{full_name}.git")
        check_page(page, artifacts_dir, "repo-home-clone-copy")

        generated = create_user(page, site, "copied")
        copies(page, page.get_by_role("button", name="Copy the password of copied to the clipboard"), generated)
        expect(page.locator("#new-password-copy-status")).to_have_text("Copied to the clipboard.")
        check_page(page, artifacts_dir, "admin-password-created")

        page.goto(site.at(f"/{full_name}/settings/hooks/"))
        page.get_by_label("Payload URL").fill("http://127.0.0.1:9/hook")
        page.locator("fieldset", has_text="Notification events").get_by_role("checkbox").first.check()
        page.get_by_role("button", name="Create endpoint").click()
        expect(page.get_by_role("status").first).to_contain_text("Endpoint created.")
        secret = page.locator("#new-secret").inner_text().strip()
        assert secret.startswith("whsec_")
        copies(page, page.get_by_role("button", name="Copy the signing secret to the clipboard"), secret)

        page.goto(site.at("/settings/tokens/"))
        page.get_by_label("Name", exact=True).fill("copy check")
        page.get_by_label("repo:read", exact=True).check()
        page.get_by_role("button", name="Create token").click()
        token = page.locator("#new-token").inner_text().strip()
        copies(page, page.get_by_role("button", name="Copy the new token to the clipboard"), token)

        # A url input looks like the text inputs beside it.
        page.goto(site.at("/settings/model-keys/"))
        styles = (
            "el => { const s = getComputedStyle(el);"
            " return [s.borderTopWidth, s.borderTopStyle, s.borderRadius, s.paddingLeft, s.width]; }"
        )
        url_style = page.locator("#base_url_openai").evaluate(styles)
        text_style = page.locator("#api_key_openai").evaluate(styles)
        assert url_style == text_style, (url_style, text_style)
        check_page(page, artifacts_dir, "settings-model-access")

        for path in (
            "/",
            "/repos",
            "/tasks",
            f"/{site.admin_login}",
            "/settings/profile",
            "/settings/password",
            "/settings/tokens/",
            "/admin/",
            "/admin/audit",
            f"/{full_name}",
            f"/{full_name}/commits",
            f"/{full_name}/settings/",
            f"/{full_name}/settings/tasks/",
            f"/{full_name}/settings/hooks/",
        ):
            page.goto(site.at(path))
            expect(page.locator("header.top")).to_contain_text(site.admin_login)
    assert errors == [], "\n".join(errors)


def make_person(site: ForgeServer, login: str) -> None:
    """A person with a password they chose (so not asked to change it)."""

    async def go() -> None:
        db = Database(site.settings.effective_database_url)
        try:
            async with db.session(write=True) as s:
                await accounts.create_user(s, Actor.system("test"), login, "a password of their own")
        finally:
            await db.dispose()

    run_async(go())


def danger_action(page: Page, summary: str) -> Locator:
    """Open one action of the danger zone (a disclosure) and return it."""
    item = page.locator("#danger-zone details", has_text=summary)
    if item.get_attribute("open") is None:
        item.locator("summary").click()
    expect(item.locator("form")).to_be_visible()
    return item


def test_the_danger_zone_and_removing_a_collaborator(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    """Over 30 s under the parallel suite: a collaborator added and removed, then each confirmation
    form of the danger zone (a refused rename that keeps what was typed, the rename, the transfer,
    the delete) filled in as a person would, the pages scanned by axe at two widths."""
    make_person(site, "heir")
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        full_name = create_repo(page, site.url, "danger")
        add_collaborator(page, site.url, full_name, "heir", "write")
        remove_collaborator(page, site.url, full_name, "heir")

        page.get_by_role("navigation", name="Repository settings").get_by_role("link", name="Danger zone").click()
        rename = danger_action(page, "Rename this repository")
        rename.get_by_label("New name").fill("renamed")
        rename.get_by_label(f"Type {full_name} to confirm").fill("danger")
        rename.get_by_role("button", name="Rename repository").click()
        rename = page.locator("#danger-rename")
        expect(rename.get_by_role("alert")).to_contain_text(f"type '{full_name}' to confirm")
        expect(rename.get_by_label("New name")).to_have_value("renamed")  # what was typed stays
        check_page(page, artifacts_dir, "repo-settings-danger-refused")
        rename.get_by_label(f"Type {full_name} to confirm").fill(full_name)
        rename.get_by_role("button", name="Rename repository").click()
        renamed = f"{site.admin_login}/renamed"
        expect(page).to_have_url(site.at(f"/{renamed}/settings/?done=renamed#danger-zone"))
        expect(page.get_by_role("status")).to_contain_text("Renamed. The old address no longer works")
        expect(page.locator("#clone-url")).to_have_value(site.at(f"/{renamed}.git"))

        transfer = danger_action(page, "Transfer ownership")
        transfer.get_by_label("New owner (login)").fill("heir")
        transfer.get_by_label(f"Type {renamed} to confirm").fill(renamed)
        transfer.get_by_role("button", name="Transfer repository").click()
        expect(page.get_by_role("heading", level=1)).to_have_text(f"{renamed} was transferred")
        page.get_by_role("link", name="heir/renamed").click()
        expect(page).to_have_url(site.at("/heir/renamed"))

        page.goto(site.at("/heir/renamed/settings/"))
        delete = danger_action(page, "Delete this repository")
        delete.get_by_label("Type heir/renamed to confirm").fill("heir/renamed")
        check_page(page, artifacts_dir, "repo-settings-danger-delete")
        delete.get_by_role("button", name="Delete repository").click()
        expect(page.get_by_role("heading", level=1)).to_have_text("heir/renamed was deleted")
        response = page.goto(site.at("/heir/renamed"))
        assert response is not None and response.status == 404
