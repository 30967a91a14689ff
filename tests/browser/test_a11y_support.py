"""The browser-test accessibility helpers (tests/support/a11y.py) catch what they promise to catch, on
pages served from a made-up origin by Playwright's router (nothing reaches a network)."""

from pathlib import Path

import pytest
from playwright.sync_api import Page, Route

from tests.support.a11y import (
    assert_accessible,
    assert_fits_width,
    check_page,
    no_foreign_requests,
    phone_width,
)

pytestmark = pytest.mark.browser

ORIGIN = "http://forge.test"
GOOD = """<!doctype html><html lang="en"><head><title>fine</title>
<meta name="viewport" content="width=device-width, initial-scale=1"></head>
<body><main><h1>Fine</h1><p>Readable.</p>
<pre tabindex="0" style="overflow-x:auto">{long}</pre></main></body></html>""".format(long="x" * 400)


def _serve(page: Page, pages: dict[str, str]) -> None:
    def handler(route: Route) -> None:
        path = route.request.url[len(ORIGIN) :] or "/"
        if path in pages:
            route.fulfill(status=200, content_type="text/html", body=pages[path])
        else:
            route.fulfill(status=404, content_type="text/plain", body="missing")

    page.route(f"{ORIGIN}/**", handler)


def test_a_clean_page_passes_every_check(page: Page, artifacts_dir: Path) -> None:
    _serve(page, {"/": GOOD})
    with no_foreign_requests(page, ORIGIN) as log:
        page.goto(f"{ORIGIN}/")
        check_page(page, artifacts_dir, "a11y-support-clean")
    assert log.urls == [f"{ORIGIN}/"]
    assert (artifacts_dir / "a11y-support-clean-phone.png").stat().st_size > 0


def test_serious_violations_fail_with_a_readable_list(page: Page) -> None:
    _serve(
        page,
        {
            "/": '<!doctype html><html lang="en"><head><title>bad</title></head><body><main>'
            '<img src="data:image/gif;base64,R0lGODlhAQABAAAAACw=" id="logo">'
            '<button id="empty"></button></main></body></html>'
        },
    )
    page.goto(f"{ORIGIN}/")
    with pytest.raises(AssertionError) as caught:
        assert_accessible(page)
    text = str(caught.value)
    assert "image-alt (critical)" in text
    assert "#logo" in text
    assert "button-name (critical)" in text


def test_a_request_to_another_origin_is_stopped_and_named(page: Page) -> None:
    _serve(
        page,
        {
            "/": '<!doctype html><html lang="en"><head><title>cdn</title>'
            '<script src="https://cdn.example.invalid/lib.js"></script></head><body><main>x</main></body></html>'
        },
    )
    with pytest.raises(AssertionError) as caught, no_foreign_requests(page, ORIGIN):
        page.goto(f"{ORIGIN}/")
    assert "https://cdn.example.invalid/lib.js" in str(caught.value)


def test_the_origin_defaults_to_the_first_navigation(page: Page) -> None:
    _serve(
        page,
        {
            "/": '<!doctype html><html lang="en"><head><title>img</title></head><body>'
            '<img alt="x" src="http://other.invalid/a.png"></body></html>'
        },
    )
    with pytest.raises(AssertionError, match=r"left the origin http://forge\.test"), no_foreign_requests(page):
        page.goto(f"{ORIGIN}/")


def test_overflow_at_phone_width_is_caught_outside_scroll_boxes(page: Page) -> None:
    _serve(
        page,
        {
            "/": '<!doctype html><html lang="en"><head><title>wide</title>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"></head>'
            '<body><main><table id="wide" style="width:900px"><tr><td>x</td></tr></table></main></body></html>'
        },
    )
    page.goto(f"{ORIGIN}/")
    assert_fits_width(page)  # 1280 px wide: fits
    with phone_width(page), pytest.raises(AssertionError, match=r"table#wide"):
        assert_fits_width(page)
    assert page.viewport_size == {"width": 1280, "height": 900}
