"""`StartBackoff` gives up after its attempts and names the cluster, until a reset (a scale)."""

from __future__ import annotations

import math

from elastrain.server.start_backoff import StartBackoff


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_refusals_double_then_give_up_and_a_reset_tries_again() -> None:
    clock = Clock()
    backoff = StartBackoff(base_s=2, max_s=300, clock=clock, give_up_after=4)
    delays = [backoff.refused("uid-1", f"refusal {n}", "c")[1] for n in range(1, 5)]
    assert delays[:3] == [2, 4, 8] and math.isinf(delays[3])
    clock.now = 10**9
    waiting = backoff.waiting("uid-1")
    assert waiting is not None and math.isinf(waiting[0]) and waiting[1] == "refusal 4"
    (why,) = backoff.given_up().values()
    assert list(backoff.given_up()) == ["c"]
    assert "gave up" in why and "4 refused starts" in why and "refusal 4" in why and "scale" in why
    backoff.reset("uid-1")
    assert backoff.waiting("uid-1") is None and backoff.given_up() == {}
    assert backoff.refused("uid-1", "again", "c") == (1, 2)


def test_a_start_accepted_before_the_last_attempt_resets_the_count() -> None:
    backoff = StartBackoff(clock=Clock(), give_up_after=3)
    backoff.refused("k", "no", "c")
    backoff.refused("k", "no", "c")
    backoff.started("k")
    assert backoff.refused("k", "no", "c")[0] == 1 and backoff.given_up() == {}
