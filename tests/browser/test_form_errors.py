"""A typo in one field of a long form costs nothing else: the repository's task settings, filled in
several places with one bad egress rule, come back with every value as typed, the error beside the
rules field (its accessible description, the field focused), and the typo is fixed in place and
saved without typing anything else again."""

import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.support.a11y import check_page, no_foreign_requests
from tests.support.browser import ForgeServer
from tests.support.browser_ui import create_repo, sign_in

pytestmark = [pytest.mark.browser]

RULES = "pypi.org\nhttps://bad rule\nGET http://mirror.example/debian/"
FIXED = "pypi.org\nbad-rule.example:443\nGET http://mirror.example/debian/"


def fill_settings(page: Page) -> None:
    form = page.locator("#task-settings")
    form.get_by_label(re.compile(r"^Required approvals")).fill("2")
    form.get_by_label("The person who started a task cannot approve it").check()
    form.get_by_label("Model", exact=True).first.fill("local-model")
    form.get_by_label("Model turns").fill("40")
    form.get_by_label("Mode", exact=True).select_option("allow-list")
    form.get_by_label(re.compile(r"^Rules, one per line")).fill(RULES)
    form.get_by_label(re.compile(r"^\s*pypi ")).check()
    form.get_by_label(re.compile(r"^\s*debian ")).check()
    form.get_by_label("Subtasks one task may spawn").fill("3")


def expect_typed_values(page: Page, rules: str) -> None:
    form = page.locator("#task-settings")
    expect(form.get_by_label(re.compile(r"^Required approvals"))).to_have_value("2")
    expect(form.get_by_label("The person who started a task cannot approve it")).to_be_checked()
    expect(form.get_by_label("Model", exact=True).first).to_have_value("local-model")
    expect(form.get_by_label("Model turns")).to_have_value("40")
    expect(form.get_by_label("Mode", exact=True)).to_have_value("allow-list")
    expect(form.get_by_label(re.compile(r"^Rules, one per line"))).to_have_value(rules)
    expect(form.get_by_label(re.compile(r"^\s*pypi "))).to_be_checked()
    expect(form.get_by_label(re.compile(r"^\s*debian "))).to_be_checked()
    expect(form.get_by_label(re.compile(r"^\s*npm "))).not_to_be_checked()
    expect(form.get_by_label("Subtasks one task may spawn")).to_have_value("3")


def test_an_egress_typo_is_fixed_without_retyping(page: Page, forge: ForgeServer, artifacts_dir: Path) -> None:
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    repo = create_repo(page, forge.url, "typo")
    with no_foreign_requests(page):
        page.goto(f"{forge.url}/{repo}/settings/tasks/")
        fill_settings(page)
        page.get_by_role("button", name="Save").click()

        # Everything typed is still there; the error sits at the rules field, which has the focus.
        expect(page.get_by_role("alert")).to_contain_text("Not saved")
        expect_typed_values(page, RULES)
        rules = page.get_by_label(re.compile(r"^Rules, one per line"))
        expect(rules).to_be_focused()
        expect(rules).to_have_attribute("aria-invalid", "true")
        expect(rules).to_have_accessible_description(re.compile(r"'https://bad rule'"))
        error = page.locator("#field-egress_rules .field-error")
        expect(error).to_be_visible()
        expect(error).to_contain_text("rule 'https://bad rule': a space after 'https://bad'")
        expect(error).to_contain_text("expected host[:port], *.domain[:port] or METHOD http://host/path-prefix")
        expect(error).not_to_contain_text("method")
        field_box, error_box = rules.bounding_box(), error.bounding_box()
        assert field_box and error_box and abs(field_box["y"] - error_box["y"]) < 120, (field_box, error_box)
        assert page.evaluate("window.scrollY") > 0, "the page scrolled to the refused field"
        check_page(page, artifacts_dir, "form-errors-task-settings")

        # The typo corrected where it is, by keyboard: select that line's text and type over it.
        start = RULES.index("https://bad rule")
        rules.evaluate(f"(el) => {{ el.focus(); el.setSelectionRange({start}, {start + len('https://bad rule')}); }}")
        page.keyboard.type("bad-rule.example:443")
        expect(rules).to_have_value(FIXED)
        page.get_by_role("button", name="Save").click()
        expect(page.get_by_role("status")).to_have_text("Saved.")
        expect(page.get_by_role("alert")).to_have_count(0)

        page.reload()  # as stored
        expect_typed_values(page, FIXED)
        expect(page.locator("[aria-invalid=true]")).to_have_count(0)
