"""Settings: environment and TOML, validated with messages that name the variable."""

from pathlib import Path

import pytest

from forge.core.settings import SettingsError, load_settings, prepare_data_dir


def test_defaults() -> None:
    s = load_settings(environ={})
    assert s.host == "127.0.0.1" and s.port == 8000
    assert s.data_dir == Path.cwd().resolve() / "var"  # `./var`, made absolute when loaded
    assert s.effective_database_url.startswith("sqlite+aiosqlite:///") and s.effective_database_url.endswith(
        "var/forgehand.db"
    )
    assert s.effective_base_url == "http://127.0.0.1:8000"
    assert s.task_sandbox_pool == 0  # the warm pool is opt-in


def test_a_relative_data_dir_is_made_absolute_once_where_the_command_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    from_env = load_settings(environ={"FORGEHAND_DATA_DIR": "state/../data"})
    from_option = load_settings(environ={}, data_dir=Path("data"))
    assert from_env.data_dir == from_option.data_dir == tmp_path.resolve() / "data"
    monkeypatch.chdir("/")  # later work elsewhere (git hooks run in the bare repository) sees the same
    assert from_env.effective_database_url == f"sqlite+aiosqlite:///{tmp_path.resolve() / 'data' / 'forgehand.db'}"
    assert prepare_data_dir(from_env).data_dir == tmp_path.resolve() / "data"


def test_environment_values_are_converted() -> None:
    s = load_settings(
        environ={
            "FORGEHAND_PORT": "9001",
            "FORGEHAND_DATA_DIR": "/srv/fh",
            "FORGEHAND_BASE_URL": "https://forge.example.org/",
            "FORGEHAND_DATABASE_URL": "postgresql+asyncpg://u:p@db/fh",
            "FORGEHAND_RUN_WORKER": "false",
            "FORGEHAND_TASK_SANDBOX_POOL": "3",
        }
    )
    assert s.task_sandbox_pool == 3
    assert s.port == 9001 and s.data_dir == Path("/srv/fh")
    assert s.effective_base_url == "https://forge.example.org" and s.secure_cookies
    assert not s.is_sqlite and s.run_worker is False


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"FORGEHAND_PORT": "eighty"}, "FORGEHAND_PORT"),
        ({"FORGEHAND_PORT": "70000"}, "FORGEHAND_PORT"),
        ({"FORGEHAND_BASE_URL": "ftp://x"}, "FORGEHAND_BASE_URL"),
        ({"FORGEHAND_BASE_URL": "https://user@x"}, "FORGEHAND_BASE_URL"),
        ({"FORGEHAND_DATABASE_URL": "mysql://x"}, "FORGEHAND_DATABASE_URL"),
        ({"FORGEHAND_SECRET_KEY": "short"}, "FORGEHAND_SECRET_KEY"),
        ({"FORGEHAND_RUN_WORKER": "maybe"}, "FORGEHAND_RUN_WORKER"),
        ({"FORGEHAND_LOG_FORMAT": "xml"}, "FORGEHAND_LOG_FORMAT"),
        ({"FORGEHAND_PROT": "8000"}, "FORGEHAND_PROT"),
        ({"FORGEHAND_MAX_BODY_BYTES": "0"}, "FORGEHAND_MAX_BODY_BYTES"),
        ({"FORGEHAND_WEBHOOKS_POLICY_DEADLINE_SECONDS": "30"}, "FORGEHAND_WEBHOOKS_POLICY_DEADLINE_SECONDS"),
        ({"FORGEHAND_TASK_TOKEN_BUDGET": "-1"}, "FORGEHAND_TASK_TOKEN_BUDGET"),
        ({"FORGEHAND_TASK_SANDBOX_POOL": "-1"}, "FORGEHAND_TASK_SANDBOX_POOL"),
        ({"FORGEHAND_TASK_SANDBOX_POOL": "33"}, "FORGEHAND_TASK_SANDBOX_POOL"),
        ({"FORGEHAND_MODEL_ALLOWED_HOSTS": "127.0.0.1, not a host"}, "FORGEHAND_MODEL_ALLOWED_HOSTS"),
        ({"FORGEHAND_WEBHOOKS_ALLOWED_HOSTS": "a b"}, "FORGEHAND_WEBHOOKS_ALLOWED_HOSTS"),
    ],
)
def test_errors_name_the_variable(env: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load_settings(environ=env)
    assert str(exc.value).startswith(names)


def test_the_reference_consumers_secret_variable_is_not_an_unknown_setting() -> None:
    from webhooks.cli import SECRET_ENV

    s = load_settings(environ={SECRET_ENV: "whsec_x", "FORGEHAND_PORT": "9001"})
    assert s.port == 9001


def test_toml_file_then_environment_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "forgehand.toml"
    cfg.write_text('port = 9100\nhost = "0.0.0.0"\n')
    s = load_settings(environ={"FORGEHAND_CONFIG": str(cfg), "FORGEHAND_PORT": "9200"})
    assert s.host == "0.0.0.0" and s.port == 9200
    cfg.write_text("port = 'x'\n")
    with pytest.raises(SettingsError, match=r"forgehand\.toml: port"):
        load_settings(environ={"FORGEHAND_CONFIG": str(cfg)})
    cfg.write_text("colour = 'blue'\n")
    with pytest.raises(SettingsError, match="unknown setting 'colour'"):
        load_settings(environ={"FORGEHAND_CONFIG": str(cfg)})
    cfg.write_text("port = \n")
    with pytest.raises(SettingsError, match="not valid TOML"):
        load_settings(environ={"FORGEHAND_CONFIG": str(cfg)})


def test_data_dir_generates_secret_key_once_with_private_mode(tmp_path: Path) -> None:
    s = prepare_data_dir(load_settings(environ={}, data_dir=tmp_path / "data"))
    key_file = tmp_path / "data" / "secret_key"
    assert len(s.secret_key) >= 32 and key_file.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700
    again = prepare_data_dir(load_settings(environ={}, data_dir=tmp_path / "data"))
    assert again.secret_key == s.secret_key and again.instance_id == s.instance_id
    explicit = prepare_data_dir(load_settings(environ={"FORGEHAND_SECRET_KEY": "k" * 40}, data_dir=tmp_path / "data"))
    assert explicit.secret_key == "k" * 40
