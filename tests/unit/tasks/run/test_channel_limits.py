"""The rate and the cap of a run's hook and back-channel calls, on a clock the test moves; each
instance's run channels in a directory of its own."""

from forge.core.settings import Settings
from tasks.run.gateway.limits import CallLimiter, CallLimits


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_the_rate_refills_it() -> None:
    clock = Clock()
    limiter = CallLimiter(CallLimits(rate=10, burst=5, cap=1_000), clock)
    assert [limiter.take() for _ in range(7)] == ["", "", "", "", "", "rate", "rate"]
    assert limiter.retry_after() == 1
    clock.now += 0.25  # 2.5 calls' worth
    assert [limiter.take() for _ in range(3)] == ["", "", "rate"]
    clock.now += 60  # never more than the burst at once
    assert [limiter.take() for _ in range(6)].count("") == 5
    assert limiter.calls == 12 and limiter.refused == {"rate": 4, "cap": 0}


def test_the_cap_counts_the_whole_run_whatever_the_pace() -> None:
    clock = Clock()
    limiter = CallLimiter(CallLimits(rate=1_000, burst=1_000, cap=3), clock)
    assert [limiter.take() for _ in range(4)] == ["", "", "", "cap"]
    clock.now += 3_600
    assert limiter.take() == "cap" and limiter.refused["cap"] == 2
    assert "3 hook and back-channel calls" in limiter.describe("cap")


def test_each_instance_keeps_its_run_channels_in_a_directory_of_its_own() -> None:
    a = Settings(instance_id="fh-aaaaaaaaaaaaaaaa")
    b = Settings(instance_id="fh-bbbbbbbbbbbbbbbb")
    assert a.run_channel_root == b.run_channel_root  # the default root, shared on the host
    assert a.effective_run_channel_dir.parent == a.run_channel_root
    assert a.effective_run_channel_dir != b.effective_run_channel_dir
    longest = Settings(run_channel_dir="/" + "r" * 59, instance_id="x" * 200)
    sock = longest.effective_run_channel_dir / ("0" * 16) / "gateway.sock"
    assert len(str(sock).encode()) <= 107  # a Unix socket path's limit
