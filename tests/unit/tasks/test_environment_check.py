"""The log tail an environment check shows on the settings page, and the settings form's check
request (refused as the REST body would be)."""

import pytest

from forge.core.errors import InvalidInput
from tasks.http.pages.settings import EnvironmentCheckForm, check_request
from tasks.services.environment_check import TAIL_CHARS, TAIL_LINES, tail


def test_a_short_log_is_kept_whole() -> None:
    assert tail("one\ntwo\n") == ("one\ntwo", False)


def test_a_long_log_keeps_its_last_lines() -> None:
    shown, cut = tail("".join(f"{n}\n" for n in range(1, 101)))
    assert cut and shown.splitlines() == [str(n) for n in range(101 - TAIL_LINES, 101)]


def test_long_lines_are_cut_at_a_line_start_within_the_character_bound() -> None:
    shown, cut = tail("\n".join(["x" * 3000] * 5 + ["last"]))
    assert cut and len(shown) <= TAIL_CHARS and shown.endswith("\nlast") and shown.startswith("x")
    assert all(line in ("x" * 3000, "last") for line in shown.splitlines())


def test_one_huge_line_keeps_its_end() -> None:
    shown, cut = tail("y" * (TAIL_CHARS * 2))
    assert cut and shown == "y" * TAIL_CHARS


def test_the_check_form_is_refused_like_the_rest_body() -> None:
    with pytest.raises(InvalidInput) as blank:
        check_request(EnvironmentCheckForm(command="  \r\n "))
    assert blank.value.code == "command_required"
    with pytest.raises(InvalidInput) as long:
        check_request(EnvironmentCheckForm(command="x" * 10_001))
    assert long.value.code == "invalid_command"
    sent = check_request(EnvironmentCheckForm(command=" make check\r\n", agent=" bot "))
    assert (sent.command, sent.agent) == ("make check", "bot")
