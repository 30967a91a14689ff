"""A team on a live server for the pull request tests: ana owns `ana/app` (created with a README)
and has a clone of it; the other members are collaborators with a role and a token of their own
scopes. Requests go over HTTP with a member's token; git goes through the real CLI."""

from pathlib import Path
from typing import Any

import httpx

from tests.support.accounts import LiveServer, make_account_with_token, run_sync
from tests.support.git import git

API = "/api/v1/repos/ana/app"
ANA_SCOPES = ("repo:write", "reviews:write", "webhooks:admin")


class PullTeam:
    def __init__(self, server: LiveServer, tmp: Path, members: dict[str, tuple[str, tuple[str, ...]]]) -> None:
        """`members`: login -> (role on ana/app, the scopes of their token)."""
        self.url = server.url
        self.server = server
        self.tmp = tmp
        self.ana = self.token("ana", *ANA_SCOPES)
        self.tokens = {login: self.token(login, *scopes) for login, (_role, scopes) in members.items()}
        assert self.call("POST", "/api/v1/user/repos", self.ana, json={"name": "app", "auto_init": True}).is_success
        for login, (role, _scopes) in members.items():
            r = self.call("PUT", f"{API}/collaborators/{login}", self.ana, json={"role": role})
            assert r.is_success, r.text
        self.work = tmp / "ana-work"
        git("clone", self.clone_url(self.ana), str(self.work), cwd=tmp)

    def token(self, login: str, *scopes: str) -> str:
        return run_sync(make_account_with_token(self.server.settings, login, *scopes))

    def call(self, method: str, path: str, token: str | None, **kw: object) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]

    def clone_url(self, token: str) -> str:
        return f"http://x:{token}@{self.url.removeprefix('http://')}/ana/app.git"

    def commit(self, branch: str, name: str, text: str, *, new: bool = False) -> str:
        """Write `name` on `branch` of ana's clone (made from the current branch when `new`), commit."""
        git("checkout", *(["-b"] if new else []), branch, cwd=self.work)
        path = self.work / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git("add", ".", cwd=self.work)
        git("commit", "-m", f"change {name}", cwd=self.work)
        return git("rev-parse", "HEAD", cwd=self.work).stdout.strip()

    def push(self, branch: str, *extra: str) -> str:
        """The push's answer as the person sees it (git writes `remote:` lines to stderr)."""
        return git("push", *extra, "origin", branch, cwd=self.work).stderr

    def open(self, head: str, base: str = "main", token: str | None = None, **extra: object) -> dict[str, Any]:
        body = {"title": head, "head": head, "base": base, **extra}
        r = self.call("POST", f"{API}/pulls", token or self.ana, json=body)
        assert r.status_code == 201, r.text
        return r.json()  # type: ignore[no-any-return]

    def pull(self, number: int, token: str | None = None) -> dict[str, Any]:
        r = self.call("GET", f"{API}/pulls/{number}", token or self.ana)
        assert r.status_code == 200, r.text
        return r.json()  # type: ignore[no-any-return]

    def branches(self) -> dict[str, str]:
        return {b["name"]: b["sha"] for b in self.call("GET", f"{API}/branches", self.ana).json()}
