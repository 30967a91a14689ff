"""Admin > Network in a real browser: a model endpoint on 127.0.0.1 is refused when the task
settings are saved, with the fix named; an instance admin allows the host (a typo first, fixed
without retyping the note), and the same save then goes through, on the same server. The page at
desktop and phone width, with an axe scan."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer, serve_forge
from tests.support.browser_ui import create_repo, sign_in

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForgeServer]:
    with serve_forge(tmp_path_factory.mktemp("admin-network"), {"run_worker": False}) as server:
        yield server


def save_endpoint(page: Page, site: ForgeServer, full_name: str) -> None:
    page.goto(site.at(f"/{full_name}/settings/tasks/"))
    page.locator("#anthropic_base_url").fill("http://127.0.0.1:18123")
    page.locator("#task-settings").get_by_role("button", name="Save").click()


def test_an_admin_allows_a_refused_model_host(page: Page, site: ForgeServer, artifacts_dir: Path) -> None:
    with no_foreign_requests(page, site.url):
        sign_in(page, site.url, site.admin_login, site.admin_password)
        full_name = create_repo(page, site.url, "llama")
        save_endpoint(page, site, full_name)
        expect(page.get_by_role("alert")).to_contain_text(
            "ask an instance admin to allow 127.0.0.1 in Admin > Network (model endpoints)"
        )

        page.get_by_role("navigation", name="Main", exact=True).get_by_role("link", name="Admin").click()
        page.get_by_role("list", name="Administration").get_by_role("link", name="Network").click()
        card = page.locator("#allow-model")
        card.get_by_label("Host to allow for model endpoints").fill("127.0.0.1:18123")
        card.get_by_label("Note").fill("the team's llama")
        card.get_by_role("button", name="Allow").click()
        card = page.locator("#allow-model")
        expect(card.get_by_role("alert")).to_contain_text("allow 127.0.0.1 (every port of that host)")
        expect(card.get_by_label("Note")).to_have_value("the team's llama")  # not typed again
        host = card.get_by_label("Host to allow for model endpoints")
        expect(host).to_have_attribute("aria-invalid", "true")
        host.fill("127.0.0.1")
        card.get_by_role("button", name="Allow").click()
        table = page.get_by_role("table", name="Hosts allowed for model endpoints")
        expect(table).to_contain_text("127.0.0.1")
        expect(table).to_contain_text("the team's llama")
        check_page(page, artifacts_dir, "admin-network")

        save_endpoint(page, site, full_name)  # the same server: no restart
        expect(page.get_by_role("status")).to_contain_text("Saved.")
        expect(page.locator("#anthropic_base_url")).to_have_value("http://127.0.0.1:18123")
