"""GPU inventory (real GPUs detected, or virtual ones declared) and loopback address allocation."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from elastrain.backends.usage import Nvml
from elastrain.errors import ConfigError

DEFAULT_VIRTUAL_GPUS = 8


def _nvidia_smi_list() -> list[str]:
    """The ``GPU N: NAME (UUID: ...)`` lines of ``nvidia-smi -L`` ([] when there is no nvidia-smi)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=10, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line for line in out.splitlines() if line.startswith("GPU ")]


def detect_gpus() -> int:
    """How many NVIDIA GPUs ``nvidia-smi -L`` lists (0 when there is no nvidia-smi)."""
    return len(_nvidia_smi_list())


def detect_gpu_models() -> tuple[str, ...]:
    """The model of each of this node's GPUs, in device order: NVML's device names, else the names
    ``nvidia-smi -L`` lists; () without GPUs."""
    nvml = Nvml(retry_s=0)
    try:
        models = tuple(g.name for g in nvml.snapshot().gpus)
    finally:
        nvml.close()
    if models:
        return models
    return tuple(line.partition(": ")[2].partition(" (UUID")[0].strip() for line in _nvidia_smi_list())


def parse_gpu_spec(text: str) -> tuple[str, ...]:
    """``--gpus``: ``N`` virtual GPUs of no model, or ``MODEL:N,...`` virtual GPUs of named models
    (``A100:2,V100:2``: ids 0-1 are A100s, 2-3 V100s; a bare ``N`` among them adds untyped ones).
    The model of each GPU id ('' for none); `ConfigError` saying how to write it when malformed."""
    models: list[str] = []
    for part in (p.strip() for p in text.split(",")):
        model, sep, count = part.rpartition(":")
        if not count.strip().isdigit() or (sep and not model.strip()):
            raise ConfigError(
                f"--gpus {text!r}: {part!r} is not N or MODEL:N; write e.g. --gpus 4 or --gpus A100:2,V100:2"
            )
        models += [model.strip()] * int(count)
    return tuple(models)


@dataclass(frozen=True)
class Inventory:
    """This node's GPUs (real ones get CUDA_VISIBLE_DEVICES, virtual ones are slots) and address block.

    `models` names each GPU id's model ('' for none; () for all untyped), real ones as NVML names them,
    virtual ones as ``--gpus MODEL:N`` declares them: the "GPU type" a create request may ask for.
    `address_octet` is the second octet of the 127.N.0.0/16 block containers get
    addresses from; each data directory gets its own block so two servers on one machine do not hand
    out the same address.
    """

    gpus: int
    real: bool
    address_octet: int = 1
    models: tuple[str, ...] = ()  # the model of each GPU id ('' or missing: none)

    @classmethod
    def create(cls, declared: int | str | None, data_dir: str = "") -> Inventory:
        """`declared` virtual GPUs (a count, or a ``--gpus`` spec naming models), else the detected
        real ones, else the default virtual count."""
        octet = 1 + zlib.crc32(data_dir.encode()) % 250 if data_dir else 1
        if declared is not None:
            models = parse_gpu_spec(str(declared))
            return cls(len(models), False, octet, models if any(models) else ())
        real = detect_gpus()
        if not real:
            return cls(DEFAULT_VIRTUAL_GPUS, False, octet)
        models = detect_gpu_models()
        return cls(real, True, octet, models if len(models) == real else ())

    @property
    def gpu_models(self) -> tuple[str, ...]:
        """The node's distinct GPU models, in id order (() without named ones)."""
        return tuple(dict.fromkeys(m for m in self.models if m))

    @property
    def gpu_model(self) -> str:
        """The GPU model of this node ('' for none, or virtual GPUs; several models joined by ', ')."""
        return ", ".join(self.gpu_models)

    def model_of(self, gpu_id: int) -> str:
        """The model of GPU `gpu_id` ('' for none)."""
        return self.models[gpu_id] if 0 <= gpu_id < len(self.models) else ""

    def count(self, gpu_type: str | None) -> int:
        """GPUs of model `gpu_type` (None: all of them)."""
        return (
            self.gpus
            if gpu_type is None
            else sum(1 for g in range(self.gpus) if self.model_of(g) == gpu_type)
        )

    def model_counts(self) -> dict[str, int]:
        """GPUs per named model."""
        return {model: self.count(model) for model in self.gpu_models}

    def free_ids(self, used: Iterable[int], gpu_type: str | None = None) -> list[int]:
        """GPU ids not in `used` (of model `gpu_type` only, unless None), lowest first."""
        taken = set(used)
        return [
            g
            for g in range(self.gpus)
            if g not in taken and (gpu_type is None or self.model_of(g) == gpu_type)
        ]


def allocate_address(used: set[str], octet: int = 1) -> str:
    """The lowest free address in 127.N.0.1 .. 127.N.255.254 (127.0.0.0/16 is left to the host)."""
    for third in range(256):
        for fourth in range(1, 255):
            address = f"127.{octet}.{third}.{fourth}"
            if address not in used:
                return address
    raise RuntimeError(f"no free loopback address left in 127.{octet}.0.0/16")


def parse_gpu_ids(text: str) -> list[int]:
    """``"0,3"`` -> [0, 3]."""
    return [int(g) for g in text.split(",") if g.strip()]
