"""Per-run gateway tokens: `fhr_` + 43 url-safe characters, handed to one run's sandbox. The
registry keeps only their SHA-256, each bound to (task id, run id), and forgets a token when its
run settles. It lives in the worker process: a restarted worker starts empty, so every token of
an earlier process is dead."""

import hashlib
import hmac
import secrets
import threading

import msgspec

TOKEN_PREFIX = "fhr_"


class RunGrant(msgspec.Struct, frozen=True, kw_only=True):
    task_id: int
    run_id: int
    run_uuid: str = ""  # unique across databases too (ids are not, e.g. two instances in one process)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenRegistry:
    def __init__(self) -> None:
        self._grants: dict[str, RunGrant] = {}
        self._lock = threading.Lock()  # tokens are checked on the loop, issued and revoked from anywhere

    def issue(self, task_id: int, run_id: int, run_uuid: str = "") -> str:
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        with self._lock:
            self._grants[_digest(token)] = RunGrant(task_id=task_id, run_id=run_id, run_uuid=run_uuid)
        return token

    def check(self, token: str) -> RunGrant | None:
        """The run a live token belongs to, or None (unknown, malformed or revoked)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 128:
            return None
        with self._lock:
            return self._grants.get(_digest(token))

    def allows(self, token: str, grant: RunGrant) -> bool:
        """The token is live and belongs to exactly this run (another run's token is refused)."""
        found = self.check(token)
        return found is not None and hmac.compare_digest(
            f"{found.task_id}:{found.run_id}:{found.run_uuid}", f"{grant.task_id}:{grant.run_id}:{grant.run_uuid}"
        )

    def revoke(self, token: str) -> None:
        with self._lock:
            self._grants.pop(_digest(token), None)

    def revoke_run(self, grant: RunGrant) -> int:
        """Every token of this run (whatever was issued for it)."""
        with self._lock:
            doomed = [d for d, g in self._grants.items() if g == grant]
            for digest in doomed:
                del self._grants[digest]
        return len(doomed)

    def __len__(self) -> int:
        with self._lock:
            return len(self._grants)


# The worker process's registry (one per process by design: see the module docstring).
REGISTRY = TokenRegistry()
