"""elastrain.frameworks.megatron_cpu: the config check, the CUDA -> CPU factory rewrite, the CPU RNG
tracker, and that nothing is patched where CUDA is available (no process-wide patch is applied here)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch

from elastrain.errors import ConfigError
from elastrain.frameworks import megatron_cpu


def test_supported_configs_have_no_problems() -> None:
    cfg = SimpleNamespace(use_cpu_initialization=True, sequence_parallel=False, fp16=False, bf16=False)
    ddp = SimpleNamespace(use_distributed_optimizer=False)
    assert megatron_cpu.cpu_config_problems(cfg, ddp, native=False) == []


def test_each_unsupported_option_is_named() -> None:
    cfg = SimpleNamespace(
        use_cpu_initialization=False, sequence_parallel=True, gradient_accumulation_fusion=True, bf16=True
    )
    opt = SimpleNamespace(use_distributed_optimizer=True)
    problems = megatron_cpu.cpu_config_problems(cfg, opt, native=False)
    assert problems == [
        "use_cpu_initialization=False",
        "sequence_parallel",
        "use_distributed_optimizer",
        "gradient_accumulation_fusion",
        "fp16/bf16",
    ]
    assert set(problems) <= set(megatron_cpu.UNSUPPORTED_ON_CPU)
    # GPU-style initialisation works once install_megatron_native() patched current_device()
    assert "use_cpu_initialization=False" not in megatron_cpu.cpu_config_problems(cfg, native=True)


def test_check_cpu_config_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(megatron_cpu, "cuda_available", lambda: False)
    with pytest.raises(ConfigError) as info:
        megatron_cpu.check_cpu_config(SimpleNamespace(sequence_parallel=True))
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("megatron-core on CPU (gloo) cannot use sequence_parallel (")
    assert "not supported by torch LayerNorm" in text
    megatron_cpu.check_cpu_config(SimpleNamespace(sequence_parallel=False))  # fine


def test_on_cuda_nothing_is_checked_or_patched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(megatron_cpu, "cuda_available", lambda: True)
    current_device = torch.cuda.current_device
    assert megatron_cpu.install() is False
    assert megatron_cpu.install_megatron_native() is False
    assert torch.cuda.current_device is current_device
    megatron_cpu.check_cpu_config(SimpleNamespace(sequence_parallel=True, bf16=True))


@pytest.mark.parametrize(
    ("device", "expected"),
    [("cuda", "cpu"), ("cuda:1", "cpu"), (torch.device("cuda", 0), "cpu"), ("cpu", "cpu"), ("meta", "meta")],
)
def test_cuda_to_cpu_rewrites_only_cuda_devices(device: object, expected: str) -> None:
    out = megatron_cpu.cuda_to_cpu({"dtype": torch.int, "device": device})
    assert str(out["device"]) == expected and out["dtype"] is torch.int
    assert megatron_cpu.cuda_to_cpu({"dtype": torch.int}) == {"dtype": torch.int}


def test_cpu_torch_puts_cuda_literals_on_the_cpu() -> None:
    proxy = megatron_cpu.cpu_torch()
    assert proxy.zeros([], dtype=torch.int, device="cuda").device.type == "cpu"
    assert proxy.tensor([1.0], dtype=torch.float, device="cuda").device.type == "cpu"
    assert proxy.full((2,), 3.0, device="cuda:0").tolist() == [3.0, 3.0]
    assert proxy.Tensor is torch.Tensor and proxy.distributed is torch.distributed
    assert torch.zeros is not proxy.zeros  # the real torch is untouched


def _megatron() -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core.tensor_parallel.random  # noqa: F401
    except Exception as exc:
        pytest.skip(f"megatron-core is not importable: {exc!r}")


def test_cpu_rng_tracker_forks_named_cpu_streams() -> None:
    _megatron()
    tracker = megatron_cpu._cpu_rng_tracker_class()()
    torch.manual_seed(7)
    outer = torch.get_rng_state()
    tracker.add("model-parallel-rng", 1234)
    assert torch.equal(torch.get_rng_state(), outer)  # add() leaves the default stream alone
    with tracker.fork("model-parallel-rng"):
        first = torch.rand(3)
    with tracker.fork("model-parallel-rng"):
        second = torch.rand(3)  # the stream goes on where it stopped
    torch.manual_seed(1234)
    assert torch.equal(torch.cat([first, second]), torch.rand(6))
    # the default stream does not see the forks
    torch.manual_seed(7)
    plain = torch.rand(4)
    torch.manual_seed(7)
    head = torch.rand(2)
    with tracker.fork("model-parallel-rng"):
        torch.rand(5)
    assert torch.equal(torch.cat([head, torch.rand(2)]), plain)
    with pytest.raises(Exception, match="already exists"):
        tracker.add("other", 1234)
    with pytest.raises(Exception, match="is not added"), tracker.fork("missing"):
        pass
