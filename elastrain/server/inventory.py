"""GPU inventory (real GPUs detected, or virtual ones declared) and loopback address allocation."""

from __future__ import annotations

import shutil
import subprocess
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

from elastrain.backends.usage import Nvml, gpu_models

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
    """This node's distinct GPU model names: NVML's device names, else the names ``nvidia-smi -L``
    lists; () without GPUs."""
    nvml = Nvml(retry_s=0)
    try:
        models = gpu_models(nvml.snapshot())
    finally:
        nvml.close()
    if models:
        return models
    named = (line.partition(": ")[2].partition(" (UUID")[0].strip() for line in _nvidia_smi_list())
    return tuple(dict.fromkeys(name for name in named if name))


@dataclass(frozen=True)
class Inventory:
    """This node's GPUs (real ones get CUDA_VISIBLE_DEVICES, virtual ones are slots) and address block.

    `gpu_models` names the real GPUs' models (the "GPU type" a create request may ask for); virtual
    GPUs have none. `address_octet` is the second octet of the 127.N.0.0/16 block containers get
    addresses from; each data directory gets its own block so two servers on one machine do not hand
    out the same address.
    """

    gpus: int
    real: bool
    address_octet: int = 1
    gpu_models: tuple[str, ...] = ()  # the real GPUs' model names (NVML's); () for virtual GPUs

    @classmethod
    def create(cls, declared: int | None, data_dir: str = "") -> Inventory:
        """`declared` virtual GPUs, else the detected real ones, else the default virtual count."""
        octet = 1 + zlib.crc32(data_dir.encode()) % 250 if data_dir else 1
        if declared is not None:
            return cls(declared, False, octet)
        real = detect_gpus()
        if not real:
            return cls(DEFAULT_VIRTUAL_GPUS, False, octet)
        return cls(real, True, octet, detect_gpu_models())

    @property
    def gpu_model(self) -> str:
        """The GPU model of this node ('' for none, or virtual GPUs; several models joined by ', ')."""
        return ", ".join(self.gpu_models)

    def free_ids(self, used: Iterable[int]) -> list[int]:
        """GPU ids not in `used`, lowest first."""
        taken = set(used)
        return [g for g in range(self.gpus) if g not in taken]


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
