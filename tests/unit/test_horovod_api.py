"""elastrain's Horovod API in one process: the sampler's re-split arithmetic, horovodrun's flags, and the
single-process behaviour of the optimizer and the state (a world of one: no job, no process group)."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

import elastrain.horovod as hvd
from elastrain.horovod import runner
from elastrain.horovod.elastic import sampler as sampler_module
from elastrain.horovod.elastic.sampler import ElasticSampler, padding

N = 1000


@pytest.fixture(autouse=True, scope="module")
def _initialised() -> None:
    hvd.init()  # not launched by elastrain: a world of one


def _as(monkeypatch: pytest.MonkeyPatch, rank: int, size: int) -> None:
    monkeypatch.setattr(sampler_module, "_world", lambda: (rank, size))


def run_epoch(
    monkeypatch: pytest.MonkeyPatch, phases: list[tuple[int, int | None]], batch: int, known: bool = True
) -> tuple[Counter[int], list[list[int]]]:
    """Train one epoch in phases of (world size, batches before a resize; None: to the end).

    Each phase builds its ranks' samplers from the state the previous phase committed (as the sync of
    a new generation does) and steps them in lockstep. Returns how often each index was processed and
    the number of batches each rank ran per phase.
    """
    state = {"epoch": 3, "processed_num": 0, "batch_size": batch if known else None}
    seen: Counter[int] = Counter()
    batches_per_phase = []
    for world, limit in phases:
        samplers, iterators = [], []
        for r in range(world):
            _as(monkeypatch, r, world)
            s = ElasticSampler(list(range(N)), seed=7)
            s.load_state_dict(state)
            samplers.append(s)
            iterators.append(iter(s))
        counts = [0] * world
        done = 0
        while limit is None or done < limit:
            batches = [[i for _, i in zip(range(batch), it)] for it in iterators]
            if not any(batches):
                break
            assert all(batches), f"a rank ran out of samples before the others: {[len(b) for b in batches]}"
            for r, (s, b) in enumerate(zip(samplers, batches)):
                _as(monkeypatch, r, world)
                s.record_batch(done, batch)
                seen.update(b)
                counts[r] += 1
            done += 1
        for r, s in enumerate(samplers):
            assert len(s) == len(s.indices) + len(padding(len(s.remaining_indices), world, r, s.batch_size))
        states = [s.state_dict() for s in samplers]
        assert all(st == states[0] for st in states), "ranks disagree on the committed position"
        state = states[0]
        batches_per_phase.append(counts)
    return seen, batches_per_phase


@pytest.mark.parametrize(
    "phases",
    [
        [(2, None)],
        [(2, 3), (3, None)],
        [(2, 2), (3, 2), (2, None)],
        [(4, 1), (1, 2), (3, None)],
        [(3, 5), (5, None)],
    ],
)
@pytest.mark.parametrize("batch", [16, 37])
def test_every_sample_once_per_epoch_across_resizes(monkeypatch, phases, batch) -> None:
    seen, batches = run_epoch(monkeypatch, phases, batch)
    assert sorted(seen) == list(range(N)), "a sample was skipped"
    for counts in batches:
        assert len(set(counts)) == 1, f"ranks ran different numbers of steps: {counts}"
    # a repeat only when the epoch's last step has fewer samples than ranks (then no split can give
    # every rank a sample of its own): one per rank without one
    world = phases[-1][0]
    left = N - sum(w * batch * c[0] for (w, _), c in zip(phases[:-1], batches[:-1]))
    tail = left % (batch * world)
    assert sum(seen.values()) - N == (world - tail if 0 < tail < world else 0)


def test_fewer_samples_than_ranks_at_the_end_repeats_only_those(monkeypatch) -> None:
    # 1000 = 3 * (2 * 166) + 4: the last step of a world of 2 ... then a world of 6 takes the rest
    seen, batches = run_epoch(monkeypatch, [(2, 3), (6, None)], batch=166)
    assert set(seen) == set(range(N))
    duplicates = sum(n - 1 for n in seen.values())
    assert duplicates == 2 and all(len(set(c)) == 1 for c in batches)  # 4 samples for 6 ranks


def test_without_a_batch_size_it_pads_like_horovod(monkeypatch) -> None:
    for r in range(3):
        _as(monkeypatch, r, 3)
        s = ElasticSampler(list(range(10)), shuffle=False)
        assert list(s) == [r, r + 3, r + 6, r + 9] if r == 0 else list(s) == [r, r + 3, r + 6, (r + 9) % 10]
        assert len(s) == 4  # Horovod: ceil(10 / 3) on every rank
    assert padding(10, 3, 2, None) == [1]  # Horovod's padded list is remaining + remaining[:2]


def test_len_and_split_after_a_resize(monkeypatch) -> None:
    _as(monkeypatch, 0, 2)
    s = ElasticSampler(list(range(N)), shuffle=False)
    it = iter(s)
    for b in range(3):
        assert [next(it) for _ in range(10)] == list(range(20 * b, 20 * b + 20, 2))
        s.record_batch(b, 10)
    state = s.state_dict()
    assert state["processed_num"] == 60 and state["epoch"] == 0
    _as(monkeypatch, 1, 3)
    s.load_state_dict(state)
    assert len(s) == len(range(61, N, 3)) == 313  # 940 left, rank 1 of 3
    assert list(s)[:3] == [61, 64, 67]


def test_state_dict_horovod_format_and_set_epoch(monkeypatch) -> None:
    _as(monkeypatch, 0, 1)
    s = ElasticSampler(list(range(N)), seed=3)
    s.load_state_dict({"epoch": 2, "processed_num": 100})  # Horovod's own state_dict
    order = list(range(N))
    random.Random(3 + 2).shuffle(order)  # Horovod's shuffle
    assert s.remaining_indices == order[100:]
    s.set_epoch(2)  # the epoch it is in: keeps its place (Horovod would restart it)
    assert s.processed_num == 100
    s.set_epoch(3)
    assert s.processed_num == 0 and len(s) == N
    unshuffled = ElasticSampler(list(range(N)), shuffle=False)
    assert list(unshuffled)[:5] == [0, 1, 2, 3, 4]


def test_record_indices_excludes_them_after_a_reset(monkeypatch) -> None:
    _as(monkeypatch, 0, 2)
    s = ElasticSampler(list(range(20)), shuffle=False)
    s.record_indices([0, 1, 2, 3, 15])
    s.reset()
    assert s.remaining_indices == [i for i in range(4, 20) if i != 15]
    assert s.state_dict()["processed_indices"] == [0, 1, 2, 3, 15]


# ----- horovodrun ----------------------------------------------------------------------------------
def translate(argv: list[str]) -> list[str]:
    args, command = runner.parse(argv)
    return runner.translate(args, command)[0]


def test_static_flags_become_a_fixed_size_native_run() -> None:
    assert translate(["-np", "2", "-H", "127.0.0.2:2", "python", "train.py"]) == [
        "run", "--mode", "native", "-np", "2", "-H", "127.0.0.2:2", "--", "python", "train.py",
    ]  # fmt: skip


def test_elastic_flags() -> None:
    out = translate(["-np", "2", "--max-np", "4", "--hostfile", "hf", "--verbose", "python", "t.py"])
    assert out[:11] == [
        "run",
        "--mode",
        "native",
        "-np",
        "2",
        "--min-np",
        "2",
        "--max-np",
        "4",
        "--hostfile",
        "hf",
    ]
    assert "-v" in out
    # a discovery script alone: elastic, unbounded above, at least -np below (Horovod's defaults)
    out = translate(["-np", "3", "--host-discovery-script", "./d.sh", "python", "t.py"])
    assert out[5:9] == ["--min-np", "3", "--max-np", str(runner.UNBOUNDED_NP)]
    # no -np with --min-np/--max-np: elastrain starts what the hosts offer, within the bounds
    out = translate(["--min-np", "2", "--max-np", "4", "--hostfile", "hf", "python", "t.py"])
    assert "-np" not in out and out[3:7] == ["--min-np", "2", "--max-np", "4"]


def test_command_arguments_reach_the_script_untouched() -> None:
    script_args = ["--n", "5", "-p", "3", "--verbose", "-np", "9", "--mpi", "--", "x"]
    out = translate(["-np", "2", "--fusion-threshold-mb", "32", "--", "python", "t.py", *script_args])
    assert out[out.index("--") + 1 :] == ["python", "t.py", *script_args]
    out = translate(["-np", "2", "python", "t.py", *script_args])
    assert out[out.index("--") + 1 :] == ["python", "t.py", *script_args]


def test_tuning_flags_are_accepted_and_change_nothing() -> None:
    plain = translate(["-np", "2", "python", "t.py"])
    tuned = translate(
        ["-np", "2", "--fusion-threshold-mb", "64", "--cycle-time-ms", "1", "--hierarchical-allreduce",
         "--timeline-filename", "/tmp/t.json", "--cache-capacity", "0", "--disable-cache", "--gloo",
         "-p", "2222", "--autotune", "--no-stall-check", "python", "t.py"]
    )  # fmt: skip
    assert tuned == plain


def test_environment_flags() -> None:
    args, command = runner.parse(
        ["-np", "2", "--network-interface", "eth1", "--gloo-timeout-seconds", "90", "python", "t.py"]
    )
    env = runner.translate(args, command)[1]
    assert env == {
        "GLOO_SOCKET_IFNAME": "eth1",
        "NCCL_SOCKET_IFNAME": "eth1",
        "ELASTRAIN_COLLECTIVE_TIMEOUT": "90.0",
    }


def test_slots_per_host_fills_hosts_without_slots() -> None:
    out = translate(["-np", "4", "-H", "a,b:1,c", "--slots-per-host", "2", "python", "t.py"])
    assert out[out.index("-H") + 1] == "a:2,b:1,c:2"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--no-such-flag", "-np", "2", "python", "t.py"], "unrecognized option --no-such-flag"),
        (["-np", "2", "--mpi", "python", "t.py"], "--mpi: elastrain has no MPI"),
        (["-np", "2", "--mpi-args=--map-by x", "python", "t.py"], "--mpi-args"),
        (["-np", "5", "-H", "127.0.0.2:2", "python", "t.py"], "-np 5 is larger than the 2 slots"),
        (["-np", "2"], "no training command"),
        (["python", "t.py"], "-np/--num-proc is required"),
        (["-np", "two", "python", "t.py"], "invalid int value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle) -> None:
    assert runner.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("horovodrun: error:") and needle in err, err


def test_np_above_the_hostfile_slots(tmp_path, capsys) -> None:
    (tmp_path / "hostfile").write_text("127.0.0.2 slots=2\n127.0.0.3 slots=1\n")
    assert runner.main(["-np", "4", "--hostfile", str(tmp_path / "hostfile"), "python", "t.py"]) == 2
    assert "-np 4 is larger than the 3 slots" in capsys.readouterr().err


def test_version_and_check_build(capsys) -> None:
    assert runner.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == "0.28.1+elastrain"
    assert runner.main(["--check-build"]) == 0
    out = capsys.readouterr().out
    assert "not Horovod" in out and "[X] PyTorch" in out and "[ ] MPI" in out


# ----- the API in a world of one -------------------------------------------------------------------
def test_world_of_one() -> None:
    assert (hvd.size(), hvd.rank(), hvd.local_size(), hvd.cross_size()) == (1, 0, 1, 1)
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(hvd.allreduce(t), t) and torch.equal(hvd.allreduce(t, op=hvd.Sum), t)
    assert hvd.allgather(torch.ones(2, 3)).shape == (2, 3)
    assert hvd.broadcast_object({"a": 1}) == {"a": 1} and hvd.allgather_object(5) == [5]
    assert hvd.join() == 0
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(t, op=hvd.Adasum)


def test_fp16_compression_round_trip() -> None:
    t = torch.tensor([1.5, -2.25], dtype=torch.float64)
    sent, ctx = hvd.Compression.fp16.compress(t)
    assert sent.dtype == torch.float16
    back = hvd.Compression.fp16.decompress(sent, ctx)
    assert back.dtype == torch.float64 and torch.equal(back, t)
    ints = torch.tensor([1, 2])
    assert hvd.Compression.fp16.compress(ints)[0].dtype == torch.int64


def _model_and_optimizer(**kwargs):
    model = torch.nn.Linear(3, 2)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), **kwargs
    )
    return model, opt


def test_distributed_optimizer_keeps_horovods_rules() -> None:
    model, opt = _model_and_optimizer(backward_passes_per_step=2)
    assert isinstance(opt, torch.optim.SGD)
    x = torch.ones(4, 3)
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    model(x).sum().backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        model(x).sum().backward()
    opt.step()
    opt.zero_grad()
    with pytest.raises(NotImplementedError, match="Adasum"):
        _model_and_optimizer(op=hvd.Adasum)
    with pytest.raises(ValueError, match="gradient_predivide_factor"):
        _model_and_optimizer(op=hvd.Sum, gradient_predivide_factor=2.0)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1),
            named_parameters=[("w", model.weight), ("w", model.bias)],
        )


def test_torch_state_commit_and_restore() -> None:
    model, opt = _model_and_optimizer()
    s = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)
    state = hvd.elastic.TorchState(model, opt, train_sampler=s, epoch=1, batch=0, seen=[0])
    calls = []
    state.register_reset_callbacks([lambda: calls.append(hvd.size())])
    before = model.weight.detach().clone()
    state.commit()
    with torch.no_grad():
        model.weight.add_(1.0)
    state.epoch, state.batch = 2, 7
    state.seen.append(1)
    s.record_batch(0, 4)
    state.restore()
    assert torch.equal(model.weight, before)
    assert (state.epoch, state.batch, state.seen, s.processed_num) == (1, 0, [0], 0)
    state.on_reset()
    assert calls == [1]

    @hvd.elastic.run
    def train(st, steps):
        for _ in range(steps):
            st.batch += 1
            st.commit()
        return st.batch

    assert train(state, 3) == 3
