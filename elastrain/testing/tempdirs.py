"""Working directories that do not outlive their run: a caller's own directory is kept, a temporary
one made here is removed when the run ends (pass or fail), so nothing is left in the temp dir."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def run_workdir(workdir: Path | None, prefix: str) -> Iterator[Path]:
    """`workdir` (made if missing, kept), or a fresh ``<prefix>*`` temporary directory, removed at the end."""
    if workdir is not None:
        workdir.mkdir(parents=True, exist_ok=True)
        yield workdir
        return
    made = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)
