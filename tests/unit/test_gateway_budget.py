"""The run's token budget as the gateway keeps it: what a subtask was granted is no longer the
run's to spend, and a call whose answer never said its input cost is charged its request's size."""

from tasks.run.gateway.budget import BYTES_PER_TOKEN, Budget


def test_a_grant_to_a_subtask_comes_off_what_the_run_may_spend() -> None:
    budget = Budget(1_000)
    budget.grant(600)
    assert budget.left() and not budget.exhausted.is_set()
    assert budget.admit(1, 40)
    assert budget.stream_over(1, 400)  # 600 granted + 400 streamed reach the limit
    budget.settle(1, 399)
    assert budget.left()
    budget.grant(1)
    assert not budget.left() and budget.exhausted.is_set()


def test_a_call_without_reported_input_is_charged_its_request_size() -> None:
    budget = Budget(0)
    assert budget.admit(1, 4_000 * BYTES_PER_TOKEN)
    budget.settle(1, 10, input_known=False)
    assert budget.used == 4_010
    assert budget.admit(2, 4_000 * BYTES_PER_TOKEN)
    budget.settle(2, 10)  # the provider said what the input cost: that is what counts
    assert budget.used == 4_020
