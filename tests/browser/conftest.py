"""Fixtures for browser tests: Debian's headless Chromium driven by Playwright (its PyPI wheel brings
the driver; no browser is ever downloaded) against a live forgehand on 127.0.0.1 that runs real
tasks (SQLite, in-process worker, the real sandbox image on the real Docker engine).

Browser tests are synchronous (Playwright's sync API); async set-up goes through `run_async`.
No Chromium or no Docker engine is a failure here, never a skip. Screenshots go to
`build/test-artifacts/`; a failing test also leaves a screenshot, the page HTML, the browser
console and a Playwright trace there (named after the test)."""

import os
import re
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, expect, sync_playwright
from rich.console import Console

from sandbox import DEFAULT_AGENTS_IMAGE, DEFAULT_IMAGE, build_agents_image, build_image
from tests.support.browser import ForgeServer, serve_forge
from tests.support.browser_ui import sign_in

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "build" / "test-artifacts"
CHROMIUM = os.environ.get("FORGEHAND_TEST_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# Playwright's default for every action and `expect` on a page; long waits (a task run) pass their own.
# A click that submits a form waits for the navigation it causes; on a 2-CPU machine running the
# docker tests beside this one, the in-process worker starting a sandbox has been seen to hold a page
# answer back for 20 s, so the allowance is twice that (a passing test never waits for it).
DEFAULT_TIMEOUT_MS = 40_000
expect.set_options(timeout=DEFAULT_TIMEOUT_MS)


_FAILURE_FILES = ("-failure.png", "-failure.html", "-console.txt", "-trace.zip")
_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    # Keep each phase's report on the item, so the page fixture's teardown knows whether the test failed.
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


def _safe_name(nodeid: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", nodeid.removeprefix("tests/browser/")).strip("-")[:150]


# --- the browser ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """`build/test-artifacts/` (gitignored), where browser tests save screenshots."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


# Package scope, not session: while Playwright's sync API is up, its event loop counts as running
# on the main thread, so no asyncio test (pytest-asyncio) could run after a browser test in the
# same session. Torn down when the run leaves tests/browser, it is one browser for all of them.
@pytest.fixture(scope="package")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="package")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Debian's Chromium, headless, with a fresh temporary profile (`launch` makes one)."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no Chromium at {CHROMIUM}; the browser tests need Debian's: `apt-get install -y chromium`",
            pytrace=False,
        )
    browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
    yield browser
    browser.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, locale="en-US")
    ctx.set_default_timeout(DEFAULT_TIMEOUT_MS)
    # DOM snapshots only: the screencast frames cost a tenth of a browser test's CPU, and a failure
    # leaves its own full-page screenshot.
    ctx.tracing.start(screenshots=False, snapshots=True)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext, artifacts_dir: Path, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A fresh page (own cookies) with a default timeout. On failure the test leaves
    `<test>-failure.png`, `.html`, `-console.txt` and `-trace.zip` in the artefact directory."""
    base = artifacts_dir / _safe_name(request.node.nodeid)
    for suffix in _FAILURE_FILES:  # what an earlier failure of this test left
        Path(f"{base}{suffix}").unlink(missing_ok=True)
    pg = context.new_page()
    console: list[str] = []
    pg.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    pg.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
    yield pg
    reports = request.node.stash.get(_REPORTS, {})
    failed = any(r.failed for r in reports.values())
    if failed:
        try:
            pg.screenshot(path=f"{base}-failure.png", full_page=True)
            Path(f"{base}-failure.html").write_text(pg.content(), encoding="utf-8")
        except Exception as exc:  # the page may be gone; the trace still tells
            console.append(f"(no failure screenshot: {exc})")
        Path(f"{base}-console.txt").write_text("\n".join(console) + "\n", encoding="utf-8")
        context.tracing.stop(path=f"{base}-trace.zip")
    else:
        context.tracing.stop()
    pg.close()


# --- the server ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def docker_client() -> Iterator[docker.DockerClient]:
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except docker.errors.DockerException as exc:
        pytest.fail(
            f"no Docker engine answered ({exc}); browser task tests need one: start dockerd "
            "(e.g. `nohup dockerd >/tmp/dockerd.log 2>&1 &`)",
            pytrace=False,
        )
    yield client
    client.close()


@pytest.fixture(scope="session")
def sandbox_image(docker_client: docker.DockerClient) -> str:
    """The sandbox image, built once (cached across sessions) by the same function as the CLI."""
    build_image(DEFAULT_IMAGE, console=Console(stderr=True))
    return DEFAULT_IMAGE


@pytest.fixture(scope="session")
def agents_image(sandbox_image: str) -> str:
    """The agents image (the sandbox image plus the pinned CLIs), built once, as the docker tests have it."""
    build_agents_image(DEFAULT_AGENTS_IMAGE, base=sandbox_image, console=Console(stderr=True))
    return DEFAULT_AGENTS_IMAGE


@pytest.fixture
def forge_settings() -> dict[str, Any]:
    """Extra settings for `forge` (none here). A test module that needs a variant of the server
    (a model, policy hooks to 127.0.0.1, ...) overrides this fixture with its own."""
    return {}


@pytest.fixture
def forge(
    tmp_path: Path, sandbox_image: str, docker_client: docker.DockerClient, forge_settings: dict[str, Any]
) -> Iterator[ForgeServer]:
    """The real app served by uvicorn on 127.0.0.1 in a thread: SQLite, the in-process task worker
    and the real sandbox image. One instance admin (`ADMIN_LOGIN` / `ADMIN_PASSWORD`), nothing else;
    `forge_settings` adds to (or overrides) its settings."""
    label = ""
    try:
        with serve_forge(tmp_path, {"sandbox_image": sandbox_image, **forge_settings}) as server:
            label = f"forgehand.instance={server.settings.instance_id}"
            yield server
    finally:
        # Whatever a failing test left running (the worker removes its sandboxes itself when all goes well).
        for c in docker_client.containers.list(all=True, filters={"label": label}) if label else []:
            c.remove(force=True)


@pytest.fixture
def admin_page(page: Page, forge: ForgeServer) -> Page:
    """A page signed in as the instance admin, through the sign-in form."""
    sign_in(page, forge.url, forge.admin_login, forge.admin_password)
    return page
