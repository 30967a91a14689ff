"""The run's token budget as the gateway keeps it: what a subtask was granted is no longer the
run's to spend, a call whose answer never said its input cost is charged its request's size, and
calls in parallel are admitted only while their declared maximums fit."""

from tasks.run.gateway.budget import BYTES_PER_TOKEN, Budget
from tasks.run.gateway.request import ModelRequest, declared_max_output


def test_a_grant_to_a_subtask_comes_off_what_the_run_may_spend() -> None:
    budget = Budget(1_000)
    budget.grant(600)
    assert budget.left() and not budget.exhausted.is_set()
    assert budget.admit(1, 40, 100)
    assert budget.stream_over(1, 400)  # 600 granted + 400 streamed reach the limit
    budget.settle(1, 399)
    assert budget.left()
    budget.grant(1)
    assert not budget.left() and budget.exhausted.is_set()


def test_a_call_without_reported_input_is_charged_its_request_size() -> None:
    budget = Budget(0)
    assert budget.admit(1, 4_000 * BYTES_PER_TOKEN, 1_000)
    budget.settle(1, 10, input_known=False)
    assert budget.used == 4_010
    assert budget.admit(2, 4_000 * BYTES_PER_TOKEN, 1_000)
    budget.settle(2, 10)  # the provider said what the input cost: that is what counts
    assert budget.used == 4_020


def test_parallel_calls_are_admitted_while_their_declared_maximums_fit() -> None:
    budget = Budget(5_000)
    assert budget.admit(1, 400, 2_000)  # 100 input + 2,000 output
    assert budget.admit(2, 400, 2_000)
    assert not budget.admit(3, 400, 2_000)  # 6,300 would not fit: turned away, nothing held
    budget.settle(1, 300)
    assert budget.admit(3, 400, 2_000)  # 300 + 2,100 + 2,100 fits now
    # A call that declares no maximum may spend all that is left: it goes alone or not at all.
    assert not budget.admit(4, 40, None)
    for call in (2, 3):
        budget.settle(call, 300)
    assert budget.admit(4, 40, None)
    assert not budget.admit(5, 4, 1)


def test_a_lone_call_is_admitted_whatever_it_declares_until_the_budget_is_used_up() -> None:
    budget = Budget(5_000)
    assert budget.admit(1, 400, 32_000)  # Claude Code's default max_tokens, beyond the budget
    assert not budget.admit(2, 4, 1)  # nothing else beside it
    budget.settle(1, 5_000)
    assert budget.exhausted.is_set() and not budget.left()


def test_the_declared_maximum_of_each_api() -> None:
    def declared(body: bytes, *, responses_api: bool = False) -> int | None:
        return declared_max_output(ModelRequest(body, items=responses_api), responses_api=responses_api)

    assert declared(b'{"max_tokens": 4096, "messages": []}') == 4096
    assert declared(b'{"max_completion_tokens": 100, "max_tokens": 50, "n": 3}') == 300
    assert declared(b'{"max_output_tokens": 700, "input": "hi"}', responses_api=True) == 700
    assert declared(b'{"max_tokens": 700, "input": "hi"}', responses_api=True) is None
    for bad in (b"{}", b'{"max_tokens": true}', b'{"max_tokens": "9"}', b'{"max_tokens": 0}', b'{"max_tokens": -5}'):
        assert declared(bad) is None, bad
