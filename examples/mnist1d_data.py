"""MNIST-1D, 10,000 training + 2,500 test samples, made offline by the `mnist1d` package's generator.

The data is generated once (a few seconds) and cached as ``.npz`` next to the other caches, so every
later worker loads it in milliseconds. Nothing is downloaded.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

TRAIN_SAMPLES = 10_000
TEST_SAMPLES = 2_500


def cache_path() -> Path:
    """Where the generated dataset is kept (override with ELASTRAIN_DATA_DIR)."""
    root = os.environ.get("ELASTRAIN_DATA_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "elastrain"
    )
    return Path(root) / f"mnist1d-{TRAIN_SAMPLES}-{TEST_SAMPLES}.npz"


def generate() -> dict[str, np.ndarray]:
    """Run the mnist1d generator (seeded, deterministic)."""
    os.environ.setdefault("MPLBACKEND", "Agg")
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = TRAIN_SAMPLES + TEST_SAMPLES
    args.train_split = TRAIN_SAMPLES / (TRAIN_SAMPLES + TEST_SAMPLES)
    data = make_dataset(args)
    return {
        "x": data["x"].astype(np.float32),
        "y": data["y"].astype(np.int64),
        "x_test": data["x_test"].astype(np.float32),
        "y_test": data["y_test"].astype(np.int64),
    }


def load() -> dict[str, np.ndarray]:
    """Load the cached dataset, generating it first if needed (safe when many workers race)."""
    path = cache_path()
    if not path.exists():
        data = generate()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **data)
        os.replace(tmp, path)
    with np.load(path) as npz:
        data = {k: npz[k] for k in npz.files}
    assert len(data["y"]) == TRAIN_SAMPLES and len(data["y_test"]) == TEST_SAMPLES
    return data


if __name__ == "__main__":
    d = load()
    print(cache_path(), {k: v.shape for k, v in d.items()})
