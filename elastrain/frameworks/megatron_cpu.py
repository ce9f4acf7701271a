"""Run megatron-core (Megatron-LM's library) on a CPU-only machine with gloo: an explicit runtime shim.

megatron-core's tensor-parallel layers and ``GPTModel`` are plain PyTorch plus collectives, so they
compute correctly on the CPU with the gloo backend, but a few places assume a CUDA device. Tested
with megatron-core 0.16.1 and torch 2.13.0+cpu; megatron-core itself is not modified. On a machine
where CUDA is available both entry points do nothing and megatron's own CUDA paths are used.

`install()`: the layers and ``GPTModel`` (trained with any torch optimizer). It replaces

1. the RNG tracker: ``model_parallel_cuda_manual_seed`` and dropout in tensor-parallel regions go
   through ``CudaRNGStatesTracker``, which calls ``torch.cuda.get_rng_state()``
   (tensor_parallel/random.py) -> "Torch not compiled with CUDA enabled". The replacement keeps one
   state per name for the CPU generator and forks it the same way (per-TP-rank dropout streams).
2. ``GlobalMemoryBuffer.get_tensor`` (core/utils.py), the scratch buffer of the local attention
   (``DotProductAttention``), which allocates on ``torch.cuda.current_device()``: on the CPU instead.

`install_megatron_native()`: also megatron's training machinery (``get_forward_backward_func``,
``megatron.core.distributed.DistributedDataParallel`` with
``finalize_model_grads``, ``get_megatron_optimizer`` in fp32 with gradient clipping). It adds

3. ``torch.cuda.current_device()`` -> ``"cpu"`` and no-op ``torch.cuda.synchronize`` /
   ``empty_cache``, process-wide (DDP's gradient buffers are allocated on the current device);
4. a ``torch`` stand-in for four megatron modules that hard-code ``device="cuda"`` (the schedules'
   token counter, the optimizer's found-inf and scale tensors, the grad-norm buffers, the local
   l2-norm): its ``zeros``/``ones``/``empty``/``tensor``/``full`` put those tensors on the CPU;
5. ``clip_grad_by_total_norm_fp32`` (asserts ``torch.cuda.FloatTensor`` gradients), in the
   optimizer's namespace, by the same scaling without the device check.

Not supported on CPU (`UNSUPPORTED_ON_CPU` holds the error megatron gives for each; `check_cpu_config`
refuses the config options among them first, in one line): the distributed optimizer, sequence parallelism,
gradient-accumulation fusion, fp16/bf16 mixed precision (megatron's mixed-precision optimizer wants
``torch.cuda`` tensors), Transformer Engine / Apex fused kernels (use ``get_gpt_layer_local_spec``).
``use_cpu_initialization=False`` and megatron's ``dist_checkpointing`` of the model (saved at TP 2,
loaded at TP 1) need `install_megatron_native` (patch 3; with `install()` alone both fail with "Torch
not compiled with CUDA enabled"). Pipeline parallelism (gloo send/recv) ran 2 steps at PP=2 and is not
tested beyond that. ``examples/megatron_gpt.py`` checkpoints with ``torch.save`` per TP rank.
"""

from __future__ import annotations

import contextlib
import importlib
import operator
import types
from collections.abc import Callable, Iterator
from functools import reduce
from typing import Any

from elastrain.errors import ConfigError

TESTED_MEGATRON_CORE = "0.16.1"

# option -> the error megatron-core 0.16.1 gives on a CPU-only torch 2.13 with gloo, shim installed
UNSUPPORTED_ON_CPU: dict[str, str] = {
    "use_cpu_initialization=False": (
        "without install_megatron_native(): AssertionError: Torch not compiled with CUDA enabled "
        "(tensor_parallel/layers.py:261, weights created on torch.cuda.current_device())"
    ),
    "sequence_parallel": (
        "AssertionError: sequence parallel not supported by torch LayerNorm (the local layer spec's "
        "WrappedTorchNorm; the norms that support it are Transformer Engine's and Apex's, CUDA-only)"
    ),
    "use_distributed_optimizer": (
        "TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor, "
        "or torch.cuda.BFloat16Tensor. Received torch.FloatTensor (optimizer/distrib_optimizer.py:431)"
    ),
    "gradient_accumulation_fusion": (
        "RuntimeError: ColumnParallelLinear was called with gradient_accumulation_fusion set to True "
        "but the custom CUDA extension fused_weight_gradient_mlp_cuda module is not found"
    ),
    "fp16/bf16": (
        "TypeError: Wrapped parameters must be one of torch.cuda.FloatTensor, torch.cuda.HalfTensor, "
        "or torch.cuda.BFloat16Tensor. Received torch.BFloat16Tensor (optimizer/optimizer.py:695)"
    ),
    "transformer_engine": (
        "NameError: name 'TESpecProvider' is not defined (get_gpt_layer_with_transformer_engine_spec "
        "without Transformer Engine, which is CUDA-only: use get_gpt_layer_local_spec())"
    ),
}


def cuda_available() -> bool:
    """Whether torch can use a CUDA device here (then the shim does nothing)."""
    import torch

    return bool(torch.cuda.is_available())


_installed: set[str] = set()  # which groups of patches this process applied


def _cpu_rng_tracker_class() -> type:
    """A `CudaRNGStatesTracker` subclass whose named states are states of the CPU generator."""
    import torch
    from megatron.core.tensor_parallel import random as mrandom

    class CpuRNGStatesTracker(mrandom.CudaRNGStatesTracker):
        """Megatron's RNG tracker on the CPU generator: `add` seeds a named state, `fork` uses it."""

        def add(self, name: str, seed: int) -> None:
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            outer = torch.get_rng_state()
            torch.manual_seed(seed)
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

        @contextlib.contextmanager
        def fork(self, name: str = mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME) -> Iterator[None]:
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def _cpu_get_tensor(
    self: Any, tensor_shape: Any, dtype: Any, name: str, mem_alloc_context: Callable[..., Any] | None = None
) -> Any:
    """`GlobalMemoryBuffer.get_tensor` allocating its buffer on the CPU (same reuse rules)."""
    import torch

    required = reduce(operator.mul, tensor_shape, 1)
    buf = self.buffer.get((name, dtype))
    if buf is None or buf.numel() < required:
        self.buffer[(name, dtype)] = torch.empty(required, dtype=dtype, device="cpu", requires_grad=False)
    return self.buffer[(name, dtype)][0:required].view(*tensor_shape)


def install() -> bool:
    """Patch megatron-core's RNG tracker and global memory buffer for the CPU (patches 1 and 2).

    Call once per process after ``parallel_state.initialize_model_parallel`` and before
    ``model_parallel_cuda_manual_seed`` (without ``force_reset_rng``, which would put megatron's CUDA
    tracker back) and building the model. Returns False (and patches nothing) where CUDA is
    available; calling it again is harmless.
    """
    if cuda_available():
        return False
    if "layers" in _installed:
        return True
    from megatron.core import utils as mutils
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._CUDA_RNG_STATE_TRACKER = _cpu_rng_tracker_class()()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    mutils.GlobalMemoryBuffer.get_tensor = _cpu_get_tensor
    _installed.add("layers")
    return True


# megatron-core 0.16 modules with tensors hard-coded to device="cuda" (patch 4)
CUDA_LITERAL_MODULES: tuple[str, ...] = (
    "megatron.core.pipeline_parallel.schedules",  # total_num_tokens
    "megatron.core.optimizer.optimizer",  # found_inf, _dummy_overflow_buf, _scale_one, _scale
    "megatron.core.optimizer.clip_grads",  # total_norm, dummy_overflow_buf, total_num_zeros
    "megatron.core.utils",  # local_multi_tensor_l2_norm
)
_FACTORIES = ("zeros", "ones", "empty", "tensor", "full")


def cuda_to_cpu(kwargs: dict[str, Any]) -> dict[str, Any]:
    """`kwargs` of a tensor factory with a CUDA ``device`` (``"cuda"``, ``"cuda:1"``, a
    ``torch.device``) replaced by ``"cpu"``; other devices are left alone."""
    device = kwargs.get("device")
    if device is not None and str(device).startswith("cuda"):
        return {**kwargs, "device": "cpu"}
    return kwargs


def cpu_torch() -> types.ModuleType:
    """A stand-in for the ``torch`` module whose tensor factories turn a CUDA device into the CPU."""
    import torch

    proxy = types.ModuleType("torch", "torch, with CUDA tensor factories on the CPU (elastrain)")
    proxy.__dict__.update({k: getattr(torch, k) for k in dir(torch) if not k.startswith("__")})

    def on_cpu(factory: Callable[..., Any]) -> Callable[..., Any]:
        def make(*args: Any, **kwargs: Any) -> Any:
            return factory(*args, **cuda_to_cpu(kwargs))

        make.__name__ = factory.__name__
        return make

    for name in _FACTORIES:
        setattr(proxy, name, on_cpu(getattr(torch, name)))
    return proxy


def _clip_grad_by_total_norm_fp32(
    parameters: Any, max_norm: float, total_norm: float, use_decoupled_grad: bool = False
) -> None:
    """megatron's ``clip_grad_by_total_norm_fp32`` without its ``torch.cuda.FloatTensor`` assert."""
    import torch

    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff < 1.0 and grads:
        torch._foreach_mul_(grads, coeff)


def install_megatron_native() -> bool:
    """`install()` plus patches 3-5, for megatron's schedule, DDP and optimizer on the CPU.

    Call where `install()` is called. Returns False (and patches nothing) where CUDA is available.
    """
    if not install():
        return False
    if "native" in _installed:
        return True
    import torch

    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.synchronize = lambda *_a, **_k: None
    torch.cuda.empty_cache = lambda *_a, **_k: None
    proxy = cpu_torch()
    for name in CUDA_LITERAL_MODULES:
        importlib.import_module(name).torch = proxy  # type: ignore[attr-defined]
    from megatron.core.optimizer import optimizer as moptimizer

    moptimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32
    _installed.add("native")
    return True


def cpu_config_problems(*configs: Any, native: bool = True) -> list[str]:
    """The `UNSUPPORTED_ON_CPU` keys that megatron configs (``TransformerConfig``,
    ``DistributedDataParallelConfig``, ``OptimizerConfig``, or objects with the same attributes) ask
    for; `native`: whether `install_megatron_native` (which makes GPU-style initialisation work) is in."""
    problems: list[str] = []

    def wants(attr: str) -> bool:
        return any(bool(getattr(c, attr, False)) for c in configs)

    if not native and any(getattr(c, "use_cpu_initialization", True) is False for c in configs):
        problems.append("use_cpu_initialization=False")
    for attr in ("sequence_parallel", "use_distributed_optimizer", "gradient_accumulation_fusion"):
        if wants(attr):
            problems.append(attr)
    if wants("fp16") or wants("bf16"):
        problems.append("fp16/bf16")
    return problems


def check_cpu_config(*configs: Any) -> None:
    """`ConfigError` (one line: the options and megatron's errors for them) when `configs` ask for
    something megatron-core cannot do on the CPU; nothing where CUDA is available."""
    if cuda_available():
        return
    problems = cpu_config_problems(*configs, native="native" in _installed)
    if problems:
        why = "; ".join(f"{p}: {UNSUPPORTED_ON_CPU[p]}" for p in problems)
        raise ConfigError(f"megatron-core on CPU (gloo) cannot use {', '.join(problems)} ({why})")
