"""The first hour of a team lead trying forgehand, in a real browser against `forgehand serve` started
as `make run` starts it (its own process, the default relative data directory `./var`, the demo
seeded, root's password generated, the in-process worker, the real engine and agents image), with
the shipped reference policy consumer as its own process and a scripted Anthropic endpoint on
127.0.0.1. Each step asserts what the person sees:

1. sign in with the generated password and be made to change it; the password file is gone;
2. a token, a clone and a push through the real git CLI, answered without a traceback;
3. a personal Anthropic key with a base URL and a model, refused at save with the fix named;
4. the host allowed by the admin in Admin > Network, and the same save accepted (no restart);
5. the demo repository lets tasks spend personal keys, and its policy endpoint is the shipped
   consumer with `--ask-tool-pattern`;
6. a claude-code task whose shell call the consumer asks about, approved on the task page, and
   the work waiting for review;
7. an egress rule typo corrected in place, nothing else typed again.

One test because each step needs the one before; over 30 s because a real Claude Code run and
its approval run each start a container."""

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect

from tests.support.anthropic import ScriptedAnthropic, text, tool_use
from tests.support.browser_ui import (
    add_policy_hook,
    approval_card,
    decide_approval,
    expect_task_state,
    sign_in,
    start_task,
)
from tests.support.ports import free_port
from tests.support.waiting import until_sync

pytestmark = [pytest.mark.browser, pytest.mark.docker]

BIN = Path(sys.executable).parent
KEY = "sk-ant-first-hour-personal-key-0123456789"
MODEL = "claude-first-hour"
NEW_PASSWORD = "the team lead's own passphrase"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    return env | {"GIT_TERMINAL_PROMPT": "0"} | extra


@contextmanager
def forge_as_make_run_starts_it(home: Path, port: int) -> Iterator[str]:
    """`forgehand serve` in `home` with no data directory set: `./var`, as `make run` has it."""
    env = clean_env(FORGEHAND_PORT=str(port), FORGEHAND_BASE_URL=f"http://127.0.0.1:{port}")
    log = (home / "serve.log").open("wb")
    server = subprocess.Popen([str(BIN / "forgehand"), "serve"], cwd=home, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert server.poll() is None, (home / "serve.log").read_text()
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        until_sync(healthy, timeout=90, what="forgehand serve answering /healthz")
        yield url
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        log.close()


@contextmanager
def shipped_consumer(port: int, secret: str, ask_pattern: str) -> Iterator[subprocess.Popen[str]]:
    """`forgehand hooks serve --ask-tool-pattern`, its secret in the environment (not on argv)."""
    hook_url = f"http://127.0.0.1:{port}/forgehand"
    args = [str(BIN / "forgehand"), "hooks", "serve", "--audience", hook_url, "--port", str(port)]
    args += ["--ask-tool-pattern", ask_pattern]
    env = clean_env(FORGEHAND_HOOKS_SECRET=secret)
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def listening() -> bool:
        assert proc.poll() is None, proc.communicate()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return True
        except OSError:
            return False

    try:
        until_sync(listening, timeout=30, what="the reference consumer listening")
        yield proc
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def change_generated_password(page: Page, url: str, home: Path) -> None:
    password_file = home / "var" / "admin-password.txt"
    fields = dict(line.split(": ", 1) for line in password_file.read_text().splitlines())
    sign_in(page, url, fields["login"], fields["password"])
    expect(page).to_have_url(re.compile(r"/settings/password"))
    expect(page.locator("#password-required")).to_contain_text("Choose your own password before you go on")
    page.get_by_label("Current password").fill(fields["password"])
    page.get_by_label("New password", exact=True).fill(NEW_PASSWORD)
    page.get_by_label("New password again").fill(NEW_PASSWORD)
    page.get_by_role("button", name="Change password").click()
    expect(page.locator("#password-notice")).to_contain_text("Password changed")
    assert not password_file.exists(), "root's generated password is still on disk after the change"


def create_token(page: Page, url: str) -> str:
    page.goto(f"{url}/settings/tokens/")
    page.locator("#name").fill("laptop")
    page.locator("input[name=scopes][value='repo:write']").check()
    page.get_by_role("button", name="Create token").click()
    token = page.locator(".secret").first.inner_text().strip()
    assert token, "the new token is shown once"
    return token


def push_a_change(url: str, token: str, work: Path) -> subprocess.CompletedProcess[str]:
    clone = f"http://root:{token}@{url.removeprefix('http://')}/root/demo.git"
    git = ["git", "-c", "user.name=Lead", "-c", "user.email=lead@example.test"]
    env = clean_env()
    subprocess.run([*git, "clone", "-q", clone, str(work)], check=True, env=env, timeout=60)
    (work / "NOTES.md").write_text("first push\n")
    subprocess.run([*git, "-C", str(work), "add", "NOTES.md"], check=True, env=env, timeout=30)
    subprocess.run([*git, "-C", str(work), "commit", "-qm", "notes"], check=True, env=env, timeout=30)
    return subprocess.run(
        [*git, "-C", str(work), "push", "origin", "main"], capture_output=True, text=True, env=env, timeout=60
    )


def save_personal_key(page: Page, url: str, base_url: str) -> None:
    page.goto(f"{url}/settings/model-keys/")
    card = page.locator("#model-key-anthropic")
    card.get_by_label("API key").fill(KEY)
    card.get_by_label(re.compile(r"^Base URL")).fill(base_url)
    card.get_by_label(re.compile(r"^Model")).fill(MODEL)
    card.get_by_role("button", name="Save").click()


def allow_host(page: Page, url: str, which: str) -> None:
    page.goto(f"{url}/admin/network/")
    card = page.locator(f"#allow-{which}")
    card.get_by_label(re.compile(r"^Host to allow")).fill("127.0.0.1")
    card.get_by_role("button", name="Allow").click()
    expect(page.get_by_role("table", name=re.compile(r"^Hosts allowed for")).nth(0)).to_be_visible()
    expect(page.locator(f"#allow-{which} table")).to_contain_text("127.0.0.1")


def allow_personal_keys(page: Page, url: str) -> None:
    page.goto(f"{url}/root/demo/settings/tasks/")
    form = page.locator("#task-settings")
    form.get_by_label("Tasks may spend the starter's personal model key").check()
    form.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved.")


def correct_an_egress_typo(page: Page, url: str) -> None:
    page.goto(f"{url}/root/demo/settings/tasks/")
    form = page.locator("#task-settings")
    form.get_by_label("Mode", exact=True).select_option("allow-list")
    rules = form.get_by_label(re.compile(r"^Rules, one per line"))
    rules.fill("pypi.org\nhttps://bad rule")
    form.get_by_label(re.compile(r"^\s*npm ")).check()
    form.get_by_role("button", name="Save").click()
    expect(page.locator("#field-egress_rules .field-error")).to_contain_text("a space after 'https://bad'")
    expect(form.get_by_label("Mode", exact=True)).to_have_value("allow-list")  # nothing else lost
    expect(form.get_by_label(re.compile(r"^\s*npm "))).to_be_checked()
    expect(rules).to_have_value("pypi.org\nhttps://bad rule")
    rules.fill("pypi.org\nbad-rule.example:443")
    form.get_by_role("button", name="Save").click()
    expect(page.get_by_role("status")).to_contain_text("Saved.")
    page.reload()
    expect(rules).to_have_value("pypi.org\nbad-rule.example:443")
    expect(form.get_by_label(re.compile(r"^\s*npm "))).to_be_checked()


def test_the_first_hour(page: Page, tmp_path: Path, agents_image: str) -> None:
    """Over 30 s: the first hour of a new instance as one story in one browser page (the
    instance started as `make run` starts it, the password change, a bot, a repository, a
    Claude Code task whose call is parked, approved and run, the review and the merge), since
    the point is that each step leads to the next without a guess."""
    call = {"command": "echo hi > /workspace/hi.txt", "description": "write hi"}
    # The parked call, then the same call again in the approval run (which runs it without asking).
    turns = [tool_use("Bash", call, id="toolu_hi"), tool_use("Bash", call), text("Wrote hi.txt.")]
    home = tmp_path / "site"
    home.mkdir()
    with ScriptedAnthropic(turns, repeat_last=True) as api, forge_as_make_run_starts_it(home, free_port()) as url:
        # 1. The generated password must be changed, and its file goes.
        change_generated_password(page, url, home)

        # 2. A push answers cleanly (the hook runs in the bare repository, not in ./var's parent).
        pushed = push_a_change(url, create_token(page, url), tmp_path / "work")
        assert pushed.returncode == 0, pushed.stderr
        assert "Traceback" not in pushed.stderr and "Error" not in pushed.stderr, pushed.stderr
        page.goto(f"{url}/root/demo")
        expect(page.get_by_role("main")).to_contain_text("NOTES.md")

        # 3. A personal key for an endpoint on 127.0.0.1: refused at save, the fix named.
        save_personal_key(page, url, api.url)
        expect(page.get_by_role("alert").first).to_contain_text("ask an instance admin to allow 127.0.0.1")
        expect(page.get_by_role("alert").first).to_contain_text("Admin > Network")
        card = page.locator("#model-key-anthropic")  # what was typed is kept, beside the refusal
        expect(card.get_by_label(re.compile(r"^Base URL"))).to_have_value(api.url)
        expect(card.get_by_label(re.compile(r"^Model"))).to_have_value(MODEL)
        expect(card.get_by_label(re.compile(r"^Base URL"))).to_have_attribute("aria-invalid", "true")

        # 4. The admin allows it (and the policy consumer's host) in the UI; the same save now holds.
        allow_host(page, url, "model")
        allow_host(page, url, "webhooks")
        save_personal_key(page, url, api.url)
        card = page.locator("#model-key-anthropic")
        expect(card).to_contain_text("A key is set")
        expect(card).to_contain_text(MODEL)

        # 5. Tasks may spend it; the shipped consumer asks about shell calls.
        allow_personal_keys(page, url)
        consumer_port = free_port()
        add_policy_hook(page, url, "root/demo", f"http://127.0.0.1:{consumer_port}/forgehand", ["pre_tool_use"])
        secret = page.locator("#new-secret").inner_text().strip()
        with shipped_consumer(consumer_port, secret, "^Bash: echo hi"):
            # 6. A claude-code task: its shell call waits for a person, who approves it on the page.
            start_task(page, url, "root/demo", goal="write hi.txt", agent="demo-agent", runtime="claude-code")
            expect(approval_card(page)).to_be_visible(timeout=180_000)
            expect(approval_card(page)).to_contain_text("echo hi > /workspace/hi.txt")
            decide_approval(page, "approve")
            expect_task_state(page, "awaiting review", timeout_ms=180_000)
            expect(page.get_by_role("main")).to_contain_text("approved by root")
            expect(page.get_by_role("main")).to_contain_text("1 file changed")
        assert any(body.get("model") == MODEL for body in api.requests), "the personal key's model was not used"

        # 7. An egress typo costs nothing else.
        correct_an_egress_typo(page, url)
    assert "Traceback" not in (home / "serve.log").read_text()
