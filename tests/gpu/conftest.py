"""The GPU suite runs where CUDA devices exist: a one-GPU part on the host, a multi-GPU part in containers.

Each test says what it needs with its marker: ``pytest.mark.gpu(devices=N, podman=True/False)``
(defaults: 1 device, no podman). Where a test's needs are not met (CI, laptops, a one-GPU machine for the
multi-GPU part) it is marked skipped with the reason at collection time, so no fixture runs: no image is
built, no server is started. `scripts/gpu_check.sh` sets ``ELASTRAIN_REQUIRE_GPU=1``, which turns "no
CUDA device at all" into a usage error: on the machine meant to run the suite, a skip of everything must
not pass for a success.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest

REQUIRE_ENV = "ELASTRAIN_REQUIRE_GPU"
HERE = Path(__file__).resolve().parent


def cuda_devices() -> int:
    """CUDA devices this machine has: torch's count, else ``nvidia-smi -L``'s (the server's inventory).

    The container tests run CUDA only inside the containers, so a CPU build of torch on the host must
    not hide the GPUs: the server detects them with nvidia-smi, as the fallback here does.
    """
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return int(torch.cuda.device_count())
    from elastrain.server.inventory import detect_gpus

    return detect_gpus()


@functools.cache
def host_torch_cuda() -> str | None:
    """Why this host's torch cannot run CUDA tensors (None: it can): the one-GPU part runs on the host."""
    import torch

    if torch.version.cuda is None:
        return f"the host's torch {torch.__version__} is a CPU build: install the pinned torch's CUDA build"
    if not torch.cuda.is_available():
        return "torch sees no CUDA device"
    return None


@functools.cache
def podman_reason() -> str | None:
    """Why podman cannot run the container part here (None: it can)."""
    from elastrain.backends.podmanctl import podman_works

    return (
        None
        if podman_works()
        else "podman with runc cannot run containers here (apt-get install podman runc)"
    )


def skip_reason(devices: int, podman: bool) -> str | None:
    """Why a test needing `devices` CUDA devices (and podman, if `podman`) cannot run here."""
    found = cuda_devices()
    if found < devices:
        return f"needs >= {devices} CUDA device(s) (found {found}): the GPU suite runs on GPU machines only"
    if podman:
        return podman_reason()
    return host_torch_cuda()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every collected test of this directory whose needs are not met skipped, with the reason."""
    mine = [item for item in items if HERE in item.path.resolve().parents]
    if not mine:
        return
    if os.environ.get(REQUIRE_ENV) == "1" and cuda_devices() == 0:
        raise pytest.UsageError(f"the GPU suite cannot run: no CUDA device here ({REQUIRE_ENV}=1 is set)")
    for item in mine:
        marker = item.get_closest_marker("gpu")
        needs = marker.kwargs if marker is not None else {}
        reason = skip_reason(int(needs.get("devices", 1)), bool(needs.get("podman", False)))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
