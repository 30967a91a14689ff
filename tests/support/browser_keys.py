"""Keyboard-only helpers for browser tests: move the focus with Tab (never a click) until it is on
the element a selector names, the way a person without a mouse gets there."""

from playwright.sync_api import Page

MAX_TABS = 120


def focused_matches(page: Page, selector: str) -> bool:
    return bool(page.evaluate("(s) => !!document.activeElement && document.activeElement.matches(s)", selector))


def tab_to(page: Page, selector: str, *, limit: int = MAX_TABS) -> None:
    """Press Tab until the focused element matches `selector`; fail after `limit` presses."""
    for _ in range(limit):
        if focused_matches(page, selector):
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"{limit} Tab presses never reached {selector!r}")
