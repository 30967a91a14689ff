"""`forgehand serve` on a fresh data directory: what `make run` does."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.waiting import until_sync
from tests.support.web import csrf_from

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))


def test_first_start_creates_admin_and_serves(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update({"FORGEHAND_DATA_DIR": str(data), "FORGEHAND_PORT": str(port), "FORGEHAND_SEED_DEMO": "false"})
    proc = subprocess.Popen([FORGEHAND, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            assert proc.poll() is None, "forgehand serve exited"
            return httpx.get(f"{base}/healthz", timeout=2).status_code == 200

        until_sync(healthy, timeout=60, what="forgehand serve to come up", ignoring=(httpx.TransportError,))
        password_file = data / "admin-password.txt"
        assert password_file.stat().st_mode & 0o777 == 0o600
        password = re.search(r"password: (\S+)", password_file.read_text())
        assert password
        assert (data / "forgehand.db").exists() and (data / "secret_key").stat().st_mode & 0o777 == 0o600
        with httpx.Client(base_url=base, timeout=10, follow_redirects=True) as client:
            page = client.get("/signin")
            csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
            assert csrf
            r = client.post(
                "/signin", data={"login": "root", "password": password.group(1), "csrf_token": csrf.group(1)}
            )
            # The generated password must be changed first; then the file that kept it is gone.
            assert r.status_code == 200 and str(r.url).endswith("/settings/password")
            assert "Choose your own password before you go on" in r.text
            form = {"current_password": password.group(1), "new_password": "root's own password"}
            form |= {"repeat_password": form["new_password"], "csrf_token": csrf_from(r.text)}
            r = client.post("/settings/password", data=form)
            assert r.status_code == 200 and "Password changed" in r.text
            assert not password_file.exists()
            assert "Welcome, root" in client.get("/").text
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert "password: " in out  # printed once on first start


def _wait_healthy(proc: subprocess.Popen[str], base: str) -> None:
    def healthy() -> bool:
        assert proc.poll() is None, "forgehand serve exited"
        return httpx.get(f"{base}/healthz", timeout=2).status_code == 200

    until_sync(healthy, timeout=60, what="forgehand serve to come up", ignoring=(httpx.TransportError,))


def test_push_to_a_server_on_the_default_relative_data_dir_prints_no_traceback(tmp_path: Path) -> None:
    """`make run` leaves FORGEHAND_DATA_DIR unset: the data directory is `./var` of the directory
    the server was started in, and git's hooks (which run inside the bare repository) must still
    find the push journal there."""
    project = tmp_path / "project"
    project.mkdir()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update({"FORGEHAND_PORT": str(port), "FORGEHAND_SEED_DEMO": "false", "HOME": str(tmp_path)})
    env.update({"GIT_AUTHOR_NAME": "Ana", "GIT_AUTHOR_EMAIL": "ana@example.org", "GIT_TERMINAL_PROMPT": "0"})
    env.update({"GIT_COMMITTER_NAME": "Ana", "GIT_COMMITTER_EMAIL": "ana@example.org"})

    def cli(*args: str) -> str:
        r = subprocess.run([FORGEHAND, *args], cwd=project, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    cli("db", "upgrade")
    cli("users", "create", "ana", "--password", "correct horse battery")
    token = cli("tokens", "create", "--user", "ana", "--name", "push", "--scope", "repo:write").splitlines()[-1]
    proc = subprocess.Popen(
        [FORGEHAND, "serve"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, base)
        auth = {"Authorization": f"Bearer {token}"}
        r = httpx.post(f"{base}/api/v1/user/repos", headers=auth, json={"name": "first"}, timeout=30)
        assert r.status_code == 201, r.text
        work = tmp_path / "work"
        for args in (["init", "-q", "-b", "main", str(work)], ["-C", str(work), "commit", "--allow-empty", "-m", "1"]):
            subprocess.run(["git", *args], env=env, check=True, capture_output=True)
        push = subprocess.run(
            ["git", "-C", str(work), "push", f"http://ana:{token}@127.0.0.1:{port}/ana/first.git", "main"],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert push.returncode == 0, push.stderr
        assert "Traceback" not in push.stderr and "Error" not in push.stderr, push.stderr
        assert "[new branch]      main -> main" in push.stderr
        journal = project / "var" / "push-journal"
        # Written before git ran, crossed out once the push is recorded.
        until_sync(lambda: not list(journal.iterdir()), timeout=30, what="the push journal emptied")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert not (project / "var" / "repos" / "ana" / "first.git" / "var").exists()
    tail = cli("audit", "tail", "-n", "50")
    pushed = [line for line in tail.splitlines() if "\trepo.push\tana/first\t" in line]
    assert len(pushed) == 1 and "refs/heads/main" in pushed[0], tail
