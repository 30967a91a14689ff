"""A model endpoint a run's calls go to (`Upstream`): its URL for a path, and the headers it is
sent (those an agent may pass on, the premium-billed Anthropic betas dropped, the real key
injected here on the host)."""

import msgspec

# Request headers an agent may pass on (the rest, its credentials first, stay here).
_PASS_REQUEST = {"anthropic-version", "anthropic-beta", "content-type", "accept", "user-agent", "openai-beta"}
# Anthropic betas that bill the same tokens at a premium (fast mode, the 1M-token context window):
# the budget counts tokens, so these would spend several times more within it.
_PREMIUM_BETAS = ("fast-mode-", "context-1m-")


def premium_betas_removed(betas: str) -> str:
    """An `anthropic-beta` header's value without the betas billed at a premium."""
    kept = [b.strip() for b in betas.split(",") if b.strip() and not b.strip().lower().startswith(_PREMIUM_BETAS)]
    return ",".join(kept)


class Upstream(msgspec.Struct, frozen=True, kw_only=True):
    provider: str  # "anthropic" | "openai"
    base_url: str  # Anthropic: without /v1 (https://api.anthropic.com); OpenAI: with it (.../v1)
    api_key: str
    model: str
    timeout: float
    # The endpoint is a repository's or a person's choice, not the operator's: its addresses are
    # checked at every connection (tasks/run/gateway/guard.py).
    guarded: bool = False

    def url(self, path: str, query: str) -> str:
        base = self.base_url.rstrip("/")
        tail = path if self.provider == "anthropic" else path.removeprefix("/v1")
        return f"{base}{tail}" + (f"?{query}" if query else "")

    def headers(self, incoming: dict[str, str]) -> list[tuple[bytes, bytes]]:
        out = {k: v for k, v in incoming.items() if k in _PASS_REQUEST}
        if "anthropic-beta" in out:
            betas = premium_betas_removed(out.pop("anthropic-beta"))
            if betas:
                out["anthropic-beta"] = betas
        out["accept-encoding"] = "identity"  # the bytes are metered as they pass: no compression
        if self.api_key:
            if self.provider == "anthropic":
                out["x-api-key"] = self.api_key
                out.setdefault("anthropic-version", "2023-06-01")
            else:
                out["authorization"] = f"Bearer {self.api_key}"
        return [(k.encode("latin-1"), v.encode("latin-1")) for k, v in out.items()]
