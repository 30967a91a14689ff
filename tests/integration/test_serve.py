"""`forgehand serve` on a fresh data directory: what `make run` does."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support.web import csrf_from

FORGEHAND = str(Path(sys.executable).with_name("forgehand"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_first_start_creates_admin_and_serves(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGEHAND_")}
    env.update({"FORGEHAND_DATA_DIR": str(data), "FORGEHAND_PORT": str(port), "FORGEHAND_SEED_DEMO": "false"})
    proc = subprocess.Popen([FORGEHAND, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, "forgehand serve exited"
            assert time.monotonic() < deadline, "forgehand serve did not come up"
            time.sleep(0.2)
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
