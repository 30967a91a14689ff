"""`forgehand worker --labels --capacity`: listed in its help, bad values refused before any start,
and the settings behind them (FORGEHAND_WORKER_LABELS, FORGEHAND_WORKER_CAPACITY) checked at load."""

import pytest
from click.testing import CliRunner

from forge.app.cli import main
from forge.core.settings import SettingsError, load_settings


def test_worker_help_lists_labels_and_capacity() -> None:
    r = CliRunner().invoke(main, ["worker", "--help"])
    assert r.exit_code == 0, r.output
    assert "--labels" in r.output and "--capacity" in r.output
    assert "FORGEHAND_WORKER_LABELS" in r.output and "FORGEHAND_WORKER_CAPACITY" in r.output


@pytest.mark.parametrize("args", [["--labels", "GPU"], ["--labels", "gpu,bad label"], ["--capacity", "0"]])
def test_bad_worker_options_are_usage_errors(args: list[str]) -> None:
    r = CliRunner().invoke(main, ["worker", *args])
    assert r.exit_code == 2, r.output  # refused by click, before settings or the database


def test_worker_settings_from_the_environment() -> None:
    s = load_settings(environ={"FORGEHAND_WORKER_LABELS": " large, gpu ,gpu", "FORGEHAND_TASK_CONCURRENCY": "3"})
    assert s.worker_label_set == frozenset({"gpu", "large"}) and s.effective_worker_capacity == 3
    assert load_settings(environ={"FORGEHAND_WORKER_CAPACITY": "5"}).effective_worker_capacity == 5
    assert load_settings(environ={}).worker_label_set == frozenset()
    with pytest.raises(SettingsError, match="FORGEHAND_WORKER_LABELS: 'G' is not a worker label"):
        load_settings(environ={"FORGEHAND_WORKER_LABELS": "G"})
    with pytest.raises(SettingsError, match="FORGEHAND_WORKER_CAPACITY"):
        load_settings(environ={"FORGEHAND_WORKER_CAPACITY": "-1"})
