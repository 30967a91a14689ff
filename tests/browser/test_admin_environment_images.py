"""Admin > Environment images in a real browser: the operator's images are listed read-only; an
instance admin registers an image (a malformed reference first, refused beside the field with the
note kept, then fixed; a second registration of it refused the same way), a repository's
environment may then start from it, and once removed it may not; both changes are in the audit log.
A person who is not an instance admin gets 403, for the page and for a removal. The page at desktop
and phone width, with an axe scan. No tasks run here: no worker, no sandbox."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, make_user, serve_forge
from tests.support.browser_ui import create_repo, sign_in

pytestmark = pytest.mark.browser

OPERATOR_IMAGE = "forgehand-test-operator-toolchain:2"
IMAGE = "rust-toolchain:1.83"
TABLE = "Registered environment images"
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeServer]:
    overrides = {"run_worker": False, "environment_extra_images": OPERATOR_IMAGE}
    with serve_forge(tmp_path_factory.mktemp("admin-environment-images"), overrides) as server:
        yield server


def declare_environment(page: Page, site: ForgeServer, full_name: str, image: str) -> None:
    page.goto(site.at(f"/{full_name}/settings/tasks/"))
    page.get_by_label("Declaration (YAML)").fill(f"image: {image}\nsetup: echo ok\n")
    page.get_by_role("button", name="Set this environment", exact=True).click()


def register(page: Page, reference: str, note: str) -> None:
    form = page.locator("#register-image")
    form.get_by_label("Image", exact=False).fill(reference)
    form.get_by_label("Note", exact=False).fill(note)
    form.get_by_role("button", name="Register", exact=True).click()


def not_an_admin_is_refused(browser: Browser, site: ForgeServer, image_id: int) -> None:
    make_user(site, "nadia")
    context = browser.new_context(locale="en-US")
    try:
        nadia = context.new_page()
        sign_in(nadia, site.url, "nadia", PASSWORD)
        response = nadia.goto(site.at("/admin/environment-images/"))
        assert response is not None and response.status == 403
        expect(nadia.get_by_role("list", name="Administration")).to_have_count(0)
        # Her own CSRF token (the sign-out form's): the refusal is the guard's, not the token check's.
        csrf = nadia.locator("input[name=csrf_token]").first.input_value()
        removal = nadia.request.post(site.at(f"/admin/environment-images/{image_id}/remove"), form={"csrf_token": csrf})
        assert removal.status == 403, removal.status
        refused = nadia.request.post(site.at("/admin/environment-images/"), form={"csrf_token": csrf, "reference": "x"})
        assert refused.status == 403, refused.status
    finally:
        context.close()


def test_an_admin_registers_and_removes_an_environment_image(
    page: Page, browser: Browser, site: ForgeServer, artifacts_dir: Path
) -> None:
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        full_name = create_repo(page, site.url, "crab")
        declare_environment(page, site, full_name, IMAGE)  # not an image an environment may use yet
        expect(page.locator("#env-error")).to_contain_text(IMAGE)

        page.get_by_role("navigation", name="Main", exact=True).get_by_role("link", name="Admin").click()
        page.get_by_role("list", name="Administration").get_by_role("link", name="Environment images").click()
        expect(page).to_have_url(site.at("/admin/environment-images/"))
        expect(page.get_by_role("heading", name="Environment images", exact=True)).to_be_visible()
        # The operator's images: listed, read-only (set in the server's environment).
        fixed = page.locator("#fixed-images")
        expect(fixed).to_contain_text("FORGEHAND_ENVIRONMENT_EXTRA_IMAGES")
        expect(fixed.get_by_role("list", name="Built-in and operator images")).to_contain_text(OPERATOR_IMAGE)
        expect(fixed.get_by_role("button")).to_have_count(0)
        expect(page.get_by_role("table", name=TABLE)).to_contain_text("No image is registered.")

        # A malformed reference: refused beside the field, what was typed kept.
        register(page, "Rust-Toolchain:1.83", "the team's rust")
        form = page.locator("#register-image")
        expect(form.get_by_role("alert")).to_contain_text("is not a local image reference")
        reference = form.get_by_label("Image", exact=False)
        expect(reference).to_have_attribute("aria-invalid", "true")
        expect(reference).to_have_value("Rust-Toolchain:1.83")
        expect(form.get_by_label("Note", exact=False)).to_have_value("the team's rust")  # not typed again
        reference.fill(IMAGE)
        form.get_by_role("button", name="Register", exact=True).click()
        row = page.get_by_role("table", name=TABLE).locator("tr", has_text=IMAGE)
        expect(row).to_contain_text("the team's rust")
        expect(row).to_contain_text(site.admin_login)
        check_page(page, artifacts_dir, "admin-environment-images")

        # Registered already: refused the same way, and nothing is added.
        register(page, IMAGE, "again")
        expect(page.locator("#register-image").get_by_role("alert")).to_contain_text("registered already")
        expect(page.get_by_role("table", name=TABLE).locator("tr", has_text=IMAGE)).to_have_count(1)

        # Not an instance admin: 403, like every admin page, for the page and for a removal.
        image_id = int((row.get_attribute("id") or "").removeprefix("image-"))
        not_an_admin_is_refused(browser, site, image_id)
        page.reload()
        expect(page.get_by_role("table", name=TABLE).locator("tr", has_text=IMAGE)).to_have_count(1)

        # In force at once: a repository's environment may start from it.
        declare_environment(page, site, full_name, IMAGE)
        expect(page.get_by_role("status")).to_contain_text("Environment saved.")

        page.goto(site.at("/admin/environment-images/"))
        page.get_by_role("button", name=f"Remove {IMAGE}", exact=True).click()
        expect(page).to_have_url(site.at("/admin/environment-images/"))
        expect(page.get_by_role("table", name=TABLE).locator("tr", has_text=IMAGE)).to_have_count(0)
        expect(page.locator("#fixed-images")).to_contain_text(OPERATOR_IMAGE)
        declare_environment(page, site, full_name, IMAGE)  # no longer allowed
        expect(page.locator("#env-error")).to_contain_text(IMAGE)

        page.goto(site.at("/admin/audit"))
        audit = page.locator("#audit")
        expect(audit.locator("tr", has_text="instance.environment_image.add")).to_contain_text(IMAGE)
        expect(audit.locator("tr", has_text="instance.environment_image.remove")).to_contain_text(IMAGE)
