"""The GPU suite runs only where >= 2 CUDA devices exist and podman can run containers.

Elsewhere (CI, laptops) every test here is marked skipped with the reason at collection time, so no
fixture runs: no image is built, no server is started. `scripts/gpu_check.sh` sets
``ELASTRAIN_REQUIRE_GPU=1``, which turns that skip into a usage error: on the machine meant to run the
suite, a skip must not pass for a success.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

MIN_GPUS = 2
REQUIRE_ENV = "ELASTRAIN_REQUIRE_GPU"
HERE = Path(__file__).resolve().parent


def cuda_devices() -> int:
    """CUDA devices this machine has: torch's count, else ``nvidia-smi -L``'s (the server's inventory).

    The tests run CUDA only inside the containers, so a CPU build of torch on the host must not hide
    the GPUs: the server detects them with nvidia-smi, as the fallback here does.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return int(torch.cuda.device_count())
    from elastrain.server.inventory import detect_gpus

    return detect_gpus()


@functools.cache
def skip_reason() -> str | None:
    """Why the GPU suite cannot run here (None: it can)."""
    found = cuda_devices()
    if found < MIN_GPUS:
        return f"needs >= {MIN_GPUS} CUDA devices (found {found}): the GPU suite runs on GPU machines only"
    from elastrain.backends.podmanctl import podman_works

    if not podman_works():
        return "podman with runc cannot run containers here (apt-get install podman runc)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every collected test of this directory skipped (with the reason) where the suite cannot run."""
    mine = [item for item in items if HERE in item.path.resolve().parents]
    if not mine:
        return
    reason = skip_reason()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        raise pytest.UsageError(f"the GPU suite cannot run: {reason} ({REQUIRE_ENV}=1 is set)")
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=reason))
