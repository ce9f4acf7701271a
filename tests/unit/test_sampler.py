"""ElasticSampler: exactly-once over any sequence of resizes and failures, simulated in one process.

A `Job` holds one sampler per rank (same seed), bound to its rank, and steps them in lockstep the way
the ranks of one generation do: every rank takes one batch per step, every rank commits the step. A
failure hands out a step and resets every rank without committing; a resize keeps some survivors (which
reset to their last commit) and gives newcomers the survivors' committed state.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict, deque
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastrain.errors import ConfigError
from elastrain.runtime.data import BatchPolicy, ElasticSampler, micro_batches, split_evenly


def bind(sampler: ElasticSampler, rank: int, world: int) -> ElasticSampler:
    sampler.bind(lambda: (rank, world))
    return sampler


def make_world(world: int, num_samples: int, batch_size: int, **kwargs: object) -> list[ElasticSampler]:
    return [bind(ElasticSampler(num_samples, batch_size, **kwargs), r, world) for r in range(world)]  # type: ignore[arg-type]


def lockstep(samplers: list[ElasticSampler]) -> Iterator[list[list[int]]]:
    """Yield each step's shares (one per rank), the way the ranks of one generation iterate."""
    iters = [iter(s) for s in samplers]
    while True:
        shares = [next(it, None) for it in iters]
        if all(share is None for share in shares):
            return
        assert all(share is not None for share in shares), "ranks disagree on the number of steps"
        yield shares  # type: ignore[misc]


def flat(shares: list[list[int]]) -> list[int]:
    return [i for share in shares for i in share]


def commit_all(samplers: list[ElasticSampler]) -> None:
    for s in samplers:
        assert s.commit_step() is not None


def check_shares(shares: list[list[int]]) -> None:
    sizes = [len(share) for share in shares]
    assert max(sizes) - min(sizes) <= 1, sizes
    indices = flat(shares)
    assert len(indices) == len(set(indices)), "a sample was given to two ranks"


class Job:
    """One training job: the samplers of the current generation plus the training loop's epoch counter."""

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        policy: str,
        seed: int,
        shuffle: bool,
        world: int,
        prefetch: int,
        epochs: int,
    ) -> None:
        self.args = (num_samples, batch_size)
        self.kwargs = {"policy": policy, "seed": seed, "shuffle": shuffle}
        self.num_samples = num_samples
        self.prefetch = prefetch  # steps a rank has been handed ahead of its commit (a DataLoader prefetches)
        self.epochs = epochs
        self.epoch = 0  # the loop's counter; like a State counter it reverts to its committed value
        self.committed_epoch = 0
        self.committed: dict[int, list[int]] = defaultdict(list)  # epoch -> indices of committed steps
        self.last_step: dict[int, tuple[int, int]] = {}  # epoch -> (start, size) of its last committed step
        self.expect_next: tuple[int, int] | None = None  # (epoch, start) a failure must re-serve
        self.done = False
        self.samplers = [ElasticSampler(*self.args, **self.kwargs) for _ in range(world)]  # type: ignore[arg-type]
        self._new_generation()

    @property
    def world(self) -> int:
        return len(self.samplers)

    def _new_generation(self) -> None:
        for rank, sampler in enumerate(self.samplers):
            bind(sampler, rank, self.world)
            sampler.reset()
            assert sampler.epoch == self.committed_epoch
        self.epoch = self.committed_epoch
        self._start_epoch()

    def _start_epoch(self) -> None:
        for sampler in self.samplers:
            sampler.set_epoch(self.epoch)
        self.iters = [iter(s) for s in self.samplers]
        self.queues: list[deque[list[int]]] = [deque() for _ in self.samplers]

    def _serve(self, ranks: int | None = None) -> bool:
        """Hand every rank (or the first `ranks`) one more batch; False at the end of the epoch."""
        shares = [next(it, None) for it in self.iters[:ranks]]
        if all(share is None for share in shares):
            return False
        assert all(share is not None for share in shares), "ranks disagree on the number of steps"
        for queue, share in zip(self.queues, shares):
            queue.append(share)  # type: ignore[arg-type]
        return True

    def _next_epoch(self) -> None:
        self.epoch += 1  # not committed until the first step of the new epoch commits
        if self.epoch == self.epochs:
            self.done = True
        else:
            self._start_epoch()

    def commit_step(self) -> None:
        """Run and commit one step on every rank, rolling over to the next epoch when this one is done."""
        while not self.done and len(self.queues[0]) < self.prefetch:
            if self._serve():
                continue
            if self.queues[0]:
                break  # the epoch's last steps are in flight
            self._next_epoch()
        if self.done:
            return
        shares = [queue.popleft() for queue in self.queues]
        check_shares(shares)
        remaining = self.samplers[0].remaining()
        steps = [s.commit_step() for s in self.samplers]
        assert all(step is not None for step in steps)
        step = steps[0]
        assert step is not None
        for other, share in zip(steps, shares):
            assert other is not None
            assert other.indices == share
            assert (other.epoch, other.start, other.size) == (self.epoch, step.start, step.size)
        assert step.size == sum(len(share) for share in shares)
        assert step.size == min(self.samplers[0].global_batch(self.world), remaining)
        assert all(s.remaining() == remaining - step.size for s in self.samplers)
        if self.expect_next is not None:
            assert (step.epoch, step.start) == self.expect_next, "the failed step was not served again"
            self.expect_next = None
        self.committed[self.epoch].extend(flat(shares))
        self.last_step[self.epoch] = (step.start, step.size)
        self.committed_epoch = self.epoch

    def _interrupt(self, served_ranks: int) -> None:
        """The loop hands the first `served_ranks` ranks their next batch (moving on to the next epoch
        if this one is used up), then the step is interrupted before it commits."""
        while served_ranks and not self.done:
            if self._serve(served_ranks) or self.queues[0]:
                break
            self._next_epoch()
        current = self.samplers[0].current()  # the oldest step handed out and not committed
        if current is not None:
            self.expect_next = (current.epoch, current.start)

    def fail(self, served_ranks: int) -> None:
        """A step is handed out (to some ranks), then every rank rolls back without committing."""
        before = [s.state_dict() for s in self.samplers]
        self._interrupt(served_ranks)
        assert [s.state_dict() for s in self.samplers] == before  # only commits move the state
        for s in self.samplers:
            s.reset()
        assert [s.state_dict() for s in self.samplers] == before
        self._new_generation()

    def resize(self, world: int, survivors: list[int], served_ranks: int) -> None:
        """A generation of `world` ranks: `survivors` (old ranks, in their new order), then newcomers
        that load a survivor's state (taken while the interrupted step was still in flight)."""
        self._interrupt(min(served_ranks, self.world))
        kept = [self.samplers[i] for i in survivors]
        state = kept[0].state_dict()
        newcomers = [ElasticSampler(*self.args, **self.kwargs) for _ in range(world - len(kept))]  # type: ignore[arg-type]
        for sampler in newcomers:
            sampler.load_state_dict(state)
        self.samplers = kept + newcomers
        self._new_generation()

    def finish(self) -> None:
        while not self.done:
            self.commit_step()


job_config = st.fixed_dictionaries(
    {
        "num_samples": st.integers(min_value=1, max_value=60),
        "batch_size": st.integers(min_value=1, max_value=9),
        "policy": st.sampled_from(["fixed", "linear"]),
        "seed": st.integers(min_value=0, max_value=3),
        "shuffle": st.booleans(),
        "world": st.integers(min_value=1, max_value=8),
        "prefetch": st.integers(min_value=1, max_value=2),
    }
)


@settings(max_examples=200, deadline=None)
@given(job_config, st.data())
def test_every_sample_exactly_once_per_epoch_across_resizes_and_failures(
    config: dict, data: st.DataObject
) -> None:
    job = Job(**config, epochs=2)
    for _ in range(data.draw(st.integers(min_value=0, max_value=40), label="events")):
        if job.done:
            break
        action = data.draw(st.sampled_from(["commit", "commit", "fail", "resize"]), label="action")
        if action == "commit":
            for _ in range(data.draw(st.integers(min_value=1, max_value=6), label="steps")):
                job.commit_step()
        elif action == "fail":
            job.fail(data.draw(st.integers(min_value=0, max_value=job.world), label="ranks served"))
        else:
            world = data.draw(st.integers(min_value=1, max_value=8), label="world")
            old = list(range(job.world))
            order = data.draw(st.permutations(old), label="survivor order")
            count = data.draw(st.integers(min_value=1, max_value=min(world, job.world)), label="survivors")
            served = data.draw(st.integers(min_value=0, max_value=job.world), label="ranks served")
            job.resize(world, order[:count], served)
    job.finish()

    assert sorted(job.committed) == [0, 1]
    for epoch in (0, 1):
        counts = Counter(job.committed[epoch])
        assert sorted(counts) == list(range(config["num_samples"])), f"epoch {epoch}: missing samples"
        assert max(counts.values()) == 1, f"epoch {epoch}: duplicated samples"
        start, size = job.last_step[epoch]
        assert start + size == config["num_samples"]  # the last step is not padded


def test_failed_step_is_served_again_to_the_same_world() -> None:
    samplers = make_world(3, 20, 6, seed=5)
    steps = lockstep(samplers)
    first = next(steps)
    commit_all(samplers)
    failed = next(steps)
    for s in samplers:
        s.reset()
    again = lockstep(samplers)
    assert next(again) == failed
    assert set(flat(failed)).isdisjoint(flat(first))
    commit_all(samplers)
    assert samplers[0].remaining() == 20 - 12


def test_failed_step_is_split_over_the_new_world_after_a_shrink() -> None:
    samplers = make_world(4, 30, 8, seed=1)
    steps = lockstep(samplers)
    next(steps)
    commit_all(samplers)
    failed = next(steps)  # ranks 2 and 3 die during this step
    survivors = samplers[:2]
    for rank, s in enumerate(survivors):
        s.reset()
        bind(s, rank, 2)
    shares = next(lockstep(survivors))
    assert [len(x) for x in shares] == [4, 4]
    assert sorted(flat(shares)) == sorted(flat(failed))


def test_resize_newcomer_continues_from_the_committed_position() -> None:
    survivor = bind(ElasticSampler(50, 10, seed=7), 0, 1)
    steps = iter(survivor)
    done = [next(steps) for _ in range(2)]
    survivor.commit_step()
    survivor.commit_step()
    next(steps)  # handed out, not committed: must not travel to the newcomer
    newcomer = ElasticSampler(50, 10, seed=7)
    newcomer.load_state_dict(survivor.state_dict())
    survivor.reset()
    bind(survivor, 0, 2)
    bind(newcomer, 1, 2)
    world = [survivor, newcomer]
    served = [i for shares in lockstep(world) for share in shares for i in share]
    assert sorted(served + flat(done)) == list(range(50))
    assert newcomer.remaining() == survivor.remaining() == 30


@pytest.mark.parametrize("num_samples", [1, 7, 64, 100])
def test_last_uneven_step_is_not_padded(num_samples: int) -> None:
    samplers = make_world(3, num_samples, 16)
    seen: list[int] = []
    for shares in lockstep(samplers):
        check_shares(shares)
        seen.extend(i for share in shares for i in share)
        commit_all(samplers)
    assert sorted(seen) == list(range(num_samples))
    assert all(s.remaining() == 0 for s in samplers)


def test_more_ranks_than_samples_in_the_last_step() -> None:
    samplers = make_world(8, 3, 4, shuffle=False)
    shares = list(lockstep(samplers))
    assert shares == [[[0], [1], [2], [], [], [], [], []]]


# ----- batch policies ------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_fixed_policy_keeps_the_global_batch(world: int) -> None:
    samplers = make_world(world, 100, 12, policy="fixed")
    first = next(lockstep(samplers))
    assert sum(len(share) for share in first) == 12
    assert samplers[0].global_batch(world) == 12
    assert len(samplers[0]) == 9  # ceil(100 / 12), whatever the world size


@pytest.mark.parametrize("world", [1, 2, 3, 5, 8])
def test_linear_policy_scales_the_global_batch(world: int) -> None:
    samplers = make_world(world, 1000, 12, policy=BatchPolicy.LINEAR)
    first = next(lockstep(samplers))
    assert [len(share) for share in first] == [12] * world
    assert samplers[0].global_batch(world) == 12 * world
    assert len(samplers[0]) == -(-1000 // (12 * world))


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError):
        ElasticSampler(10, 2, policy="exponential")


@pytest.mark.parametrize(("num_samples", "batch_size"), [(0, 1), (-3, 1), (10, 0), (10, -1)])
def test_bad_sizes_are_config_errors(num_samples: int, batch_size: int) -> None:
    with pytest.raises(ConfigError):
        ElasticSampler(num_samples, batch_size)


def test_unbound_sampler_is_a_world_of_one() -> None:
    sampler = ElasticSampler(5, 2, shuffle=False)
    assert list(sampler) == [[0, 1], [2, 3], [4]]


# ----- epochs, commits and rollbacks ---------------------------------------------------------------


def test_permutation_is_seeded_and_per_epoch() -> None:
    a, b, other = (
        ElasticSampler(100, 10, seed=3),
        ElasticSampler(100, 10, seed=3),
        ElasticSampler(100, 10, seed=4),
    )
    assert a.permutation() == b.permutation()
    assert sorted(a.permutation()) == list(range(100))
    assert a.permutation() != other.permutation()
    epoch0 = a.permutation()
    a.set_epoch(1)
    assert a.permutation() != epoch0
    assert ElasticSampler(10, 3, shuffle=False).permutation() == list(range(10))


def test_set_epoch_with_the_same_epoch_keeps_the_cursor() -> None:
    sampler = ElasticSampler(20, 5, seed=2)
    steps = iter(sampler)
    first = next(steps)
    sampler.commit_step()
    sampler.set_epoch(0)
    assert sampler.remaining() == 15
    rest = [i for share in sampler for i in share]
    assert sorted(first + rest) == list(range(20))


def test_set_epoch_with_a_new_epoch_restarts_the_cursor() -> None:
    sampler = ElasticSampler(20, 5)
    next(iter(sampler))
    sampler.commit_step()
    sampler.set_epoch(1)
    assert sampler.epoch == 1
    assert sampler.remaining() == 20
    assert len(list(sampler)) == 4


def test_reset_after_uncommitted_epoch_change_returns_to_the_committed_position() -> None:
    sampler = ElasticSampler(20, 5, seed=9)
    steps = iter(sampler)
    for _ in range(3):
        next(steps)
        sampler.commit_step()
    sampler.set_epoch(1)
    next(iter(sampler))  # a step of epoch 1 handed out, never committed
    assert sampler.state_dict()["epoch"] == 0
    assert sampler.state_dict()["cursor"] == 15
    sampler.reset()
    assert (sampler.epoch, sampler.remaining()) == (0, 5)
    assert sampler.current() is None
    last = list(sampler)
    assert len(last) == 1
    assert sorted(last[0]) == sorted(sampler.permutation()[15:])


def test_reset_after_a_committed_epoch_change_stays_in_the_new_epoch() -> None:
    sampler = ElasticSampler(10, 5)
    for _ in sampler:
        sampler.commit_step()
    sampler.set_epoch(1)
    next(iter(sampler))
    sampler.commit_step()
    next(iter(sampler))
    sampler.reset()
    assert (sampler.epoch, sampler.remaining()) == (1, 5)


def test_commit_without_a_step_in_flight_does_nothing() -> None:
    sampler = ElasticSampler(10, 5)
    assert sampler.commit_step() is None
    assert sampler.current() is None
    assert sampler.remaining() == 10


def test_prefetched_steps_commit_in_order() -> None:
    sampler = ElasticSampler(10, 3, shuffle=False)
    steps = iter(sampler)
    a, b = next(steps), next(steps)
    current = sampler.current()
    assert current is not None
    assert current.indices == a
    assert sampler.commit_step().indices == a  # type: ignore[union-attr]
    assert sampler.commit_step().indices == b  # type: ignore[union-attr]
    assert sampler.remaining() == 4
    assert len(sampler) == 2


# ----- state_dict ----------------------------------------------------------------------------------


def test_state_dict_round_trip_and_batch_size_change() -> None:
    old = ElasticSampler(40, 10, seed=1)
    steps = iter(old)
    next(steps)
    old.commit_step()
    state = old.state_dict()
    assert (state["epoch"], state["cursor"], state["num_samples"]) == (0, 10, 40)
    new = ElasticSampler(40, 4, seed=1)  # the cursor counts samples, so another batch size may resume
    new.load_state_dict(state)
    assert new.remaining() == 30
    served = [i for share in new for i in share]
    assert sorted(served) == sorted(old.permutation()[10:])


def test_load_state_dict_refuses_another_dataset_size() -> None:
    state = ElasticSampler(40, 10).state_dict()
    sampler = ElasticSampler(41, 10)
    with pytest.raises(ConfigError, match="40"):
        sampler.load_state_dict(state)
    assert sampler.remaining() == 41


def test_load_state_dict_drops_in_flight_steps() -> None:
    sampler = ElasticSampler(12, 4)
    next(iter(sampler))
    sampler.load_state_dict({**sampler.state_dict(), "cursor": 8})
    assert sampler.current() is None
    assert sampler.commit_step() is None
    assert sampler.remaining() == 4


# ----- split_evenly and micro_batches --------------------------------------------------------------


@given(st.integers(min_value=0, max_value=500), st.integers(min_value=1, max_value=64))
def test_split_evenly_tiles_the_range(total: int, parts: int) -> None:
    ranges = [split_evenly(total, parts, p) for p in range(parts)]
    assert ranges[0][0] == 0
    assert ranges[-1][1] == total
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        assert hi == lo
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)  # the bigger shares go to the lower ranks


def test_split_evenly_examples() -> None:
    assert [split_evenly(10, 3, p) for p in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [split_evenly(2, 4, p) for p in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]


@given(st.lists(st.integers(), max_size=50), st.one_of(st.none(), st.integers(min_value=1, max_value=20)))
def test_micro_batches_cover_the_share_in_order(indices: list[int], limit: int | None) -> None:
    chunks = micro_batches(indices, limit)
    assert [i for chunk in chunks for i in chunk] == indices
    if limit is None or len(indices) <= limit:
        assert chunks == [indices]
    else:
        assert all(len(chunk) == limit for chunk in chunks[:-1])
        assert 1 <= len(chunks[-1]) <= limit
        assert len(chunks) == -(-len(indices) // limit)


def test_micro_batches_examples() -> None:
    assert micro_batches([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert micro_batches([1, 2, 3], None) == [[1, 2, 3]]
    assert micro_batches([1, 2, 3], 3) == [[1, 2, 3]]
    assert micro_batches([], 4) == [[]]
