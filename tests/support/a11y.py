"""Accessibility and "nothing leaves the instance" checks for browser tests (Playwright sync API).

- `assert_accessible(page)`: an axe-core scan of the page as it is now (axe-core is bundled by the
  PyPI package `axe-playwright-python` and injected from that local file, never fetched); fails on
  serious or critical violations with a readable list (rule, impact, help, the offending elements).
- `no_foreign_requests(page)`: a context manager that records every request the page makes, aborts
  any that would leave the instance's origin (so none ever does), and fails at exit naming them.
- `phone_width(page)`: a context manager that sets a 390x844 viewport and restores the old one;
  `assert_fits_width(page)` fails when anything overflows horizontally (code blocks that scroll in
  their own box do not count); `check_page(page, artifacts_dir, name)` does all of it at desktop and
  phone width and leaves `<name>-desktop.png` and `<name>-phone.png` screenshots.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec
from playwright.sync_api import Page, Request, Route, ViewportSize

DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 390, "height": 844}
FAILING_IMPACTS = frozenset({"serious", "critical"})
# Schemes that never reach a network: what the page builds itself.
_LOCAL_SCHEMES = frozenset({"data", "blob", "about", "javascript"})
# axe-core as the wheel ships it (read, not imported: the package has no type information).
AXE_SCRIPT = files("axe_playwright_python").joinpath("axe.min.js").read_text(encoding="utf-8")


class Violation(msgspec.Struct, frozen=True):
    rule: str
    impact: str
    help: str
    help_url: str
    targets: tuple[str, ...]
    snippets: tuple[str, ...]

    def describe(self) -> str:
        lines = [f"- {self.rule} ({self.impact}): {self.help} [{self.help_url}]"]
        lines += [f"    {t}: {s}" for t, s in zip(self.targets, self.snippets, strict=True)]
        return "\n".join(lines)


def axe_violations(page: Page, *, context: str | None = None) -> list[Violation]:
    """Every axe-core violation on the current page (or inside the CSS selector `context`)."""
    page.evaluate(AXE_SCRIPT)
    results: dict[str, Any] = page.evaluate(
        "([ctx]) => axe.run(ctx ?? document, {resultTypes: ['violations']})", [context]
    )
    found: list[Violation] = []
    for v in results["violations"]:
        nodes = v.get("nodes", [])
        found.append(
            Violation(
                rule=v["id"],
                impact=v.get("impact") or "unknown",
                help=v.get("help", ""),
                help_url=v.get("helpUrl", ""),
                targets=tuple(" ".join(map(str, n.get("target", []))) for n in nodes),
                snippets=tuple(" ".join(n.get("html", "").split())[:200] for n in nodes),
            )
        )
    return found


def assert_accessible(page: Page, *, context: str | None = None, label: str = "") -> None:
    """Fail when axe-core finds a serious or critical violation on the current page."""
    bad = [v for v in axe_violations(page, context=context) if v.impact in FAILING_IMPACTS]
    if bad:
        where = label or page.url
        listing = "\n".join(v.describe() for v in bad)
        raise AssertionError(f"{len(bad)} serious/critical accessibility violation(s) on {where}:\n{listing}")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class RequestLog:
    """What `no_foreign_requests` saw: every request URL, and the ones that would have left."""

    def __init__(self, origin: str | None) -> None:
        self.origin = origin
        self.urls: list[str] = []
        self.foreign: list[str] = []

    def is_foreign(self, url: str) -> bool:
        scheme = urlsplit(url).scheme.lower()
        if scheme in _LOCAL_SCHEMES:
            return False
        if self.origin is None:  # the first real request (the navigation) fixes the origin
            self.origin = _origin(url)
            return False
        return _origin(url) != self.origin

    def check(self) -> None:
        if self.foreign:
            listing = "\n".join(f"- {u}" for u in self.foreign)
            raise AssertionError(f"{len(self.foreign)} request(s) left the origin {self.origin}:\n{listing}")


@contextmanager
def no_foreign_requests(page: Page, origin: str | None = None) -> Iterator[RequestLog]:
    """Record the page's requests; abort (and at exit, fail on) any that leave `origin`: by default
    the origin of the page's current URL, or of the first request when the page is still blank."""
    if origin is None and page.url.startswith(("http://", "https://")):
        origin = _origin(page.url)
    log = RequestLog(_origin(origin) if origin else None)

    def on_route(route: Route, request: Request) -> None:
        url = request.url
        log.urls.append(url)
        if log.is_foreign(url):
            log.foreign.append(url)
            route.abort("blockedbyclient")
        else:
            route.fallback()

    def on_websocket(ws: Any) -> None:
        url = str(ws.url).replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        log.urls.append(str(ws.url))
        if log.is_foreign(url):
            log.foreign.append(str(ws.url))

    page.route("**/*", on_route)
    page.on("websocket", on_websocket)
    try:
        yield log
    finally:
        page.unroute("**/*", on_route)
        page.remove_listener("websocket", on_websocket)
    log.check()


@contextmanager
def phone_width(page: Page) -> Iterator[Page]:
    """The page at a phone's viewport (390x844) for the block; the old viewport afterwards."""
    before = page.viewport_size
    page.set_viewport_size(PHONE)
    try:
        yield page
    finally:
        page.set_viewport_size(before or DESKTOP)


_OVERFLOW_JS = """
() => {
  const width = document.documentElement.clientWidth;
  const clipped = (el) => {
    // The document's own boxes do not count: overflow hidden on <body> would hide the very thing.
    const top = [document.body, document.documentElement];
    for (let a = el.parentElement; a && !top.includes(a); a = a.parentElement) {
      const ox = getComputedStyle(a).overflowX;
      if (ox === 'auto' || ox === 'scroll' || ox === 'hidden' || ox === 'clip') return true;
    }
    return false;
  };
  const out = [];
  for (const el of document.body.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.right <= width + 1 || clipped(el)) continue;
    const id = el.id ? '#' + el.id : '';
    const names = typeof el.className === 'string' ? el.className.trim() : '';
    const cls = names ? '.' + names.split(/\\s+/).join('.') : '';
    out.push(`${el.tagName.toLowerCase()}${id}${cls} (right edge ${Math.round(r.right)}px)`);
    if (out.length >= 15) break;
  }
  return {scroll: document.documentElement.scrollWidth, width, out};
}
"""


def assert_fits_width(page: Page) -> None:
    """Fail when the page scrolls horizontally (anything wider than the viewport that is not inside
    a box that scrolls or clips on its own, as code blocks do)."""
    got: dict[str, Any] = page.evaluate(_OVERFLOW_JS)
    if got["scroll"] > got["width"] + 1 or got["out"]:
        listing = "\n".join(f"- {e}" for e in got["out"]) or "- (the document itself)"
        raise AssertionError(
            f"{page.url} overflows a {got['width']}px viewport (scroll width {got['scroll']}px):\n{listing}"
        )


def check_page(page: Page, artifacts_dir: Path, name: str) -> None:
    """The page as it is now, at desktop width and at phone width: an axe scan at each, no
    horizontal overflow on the phone, and a full-page screenshot of each in `artifacts_dir`."""
    before = page.viewport_size
    page.set_viewport_size(DESKTOP)
    try:
        page.screenshot(path=str(artifacts_dir / f"{name}-desktop.png"), full_page=True)
        assert_accessible(page, label=f"{name} (desktop)")
        with phone_width(page):
            page.screenshot(path=str(artifacts_dir / f"{name}-phone.png"), full_page=True)
            assert_fits_width(page)
            assert_accessible(page, label=f"{name} (phone)")
    finally:
        page.set_viewport_size(before or DESKTOP)
