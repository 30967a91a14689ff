"""Codex's configuration, one list written two ways: `-c` overrides for `codex exec` and a
`config.toml` (plus the adapter's session config) for `codex app-server` under codex-acp."""

import tomllib

from tasks.run.runtimes.codex_config import codex_settings, config_toml, nested, overrides


def test_the_config_file_says_what_the_command_line_says() -> None:
    settings = codex_settings(allow_web_search=False)
    parsed = tomllib.loads(config_toml(settings, model="gpt-5.5"))
    assert parsed == nested(settings, model="gpt-5.5")
    assert parsed["model_provider"] == "forgehand"
    assert parsed["model_providers"]["forgehand"] == {
        "name": "forgehand",
        "base_url": "http://127.0.0.1:4100/v1",
        "env_key": "FORGEHAND_RUN_TOKEN",
        "wire_api": "responses",
    }
    assert parsed["features"] == {"plugins": False, "unified_exec_tty": False}
    assert parsed["analytics"] == {"enabled": False} and parsed["notify"] == []
    assert parsed["web_search"] == "disabled"
    assert parsed["mcp_servers"] == {
        "forgehand": {"url": "http://127.0.0.1:4100/mcp", "bearer_token_env_var": "FORGEHAND_RUN_TOKEN"}
    }
    # Each override is `key=<TOML value>` of the same settings.
    flags = overrides(settings)
    assert flags[::2] == ["-c"] * len(settings)
    for flag, (key, _) in zip(flags[1::2], settings, strict=True):
        name, _, value = flag.partition("=")
        assert name == key
        tomllib.loads(f"v = {value}")  # valid TOML
    assert "web_search" not in nested(codex_settings(allow_web_search=True))
