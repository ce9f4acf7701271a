"""The public face of the elastic loop: `init`, `run`, `rank`, `world_size`, `get_runtime`.

`init()` connects to the coordinator (`elastrain.runtime.connection`); `run(fn)` wraps the user's
training function in the `GenerationCycle` of its state (`elastrain.runtime.cycle`). Inside, the
function runs until it returns (the worker reports done), a new generation is announced (every rank
stops at the same commit), or a collective elastrain issued fails (a peer died). On the last two the
cycle rejoins, rebuilds the process group in the same process, broadcasts `State` from the most
advanced member and calls the function again; it resumes from the state
(``for state.epoch in range(state.epoch, N)``). The worker leaves by raising `WorkerLeft` /
`CoordinatorGone`, and a user error becomes `JobFailed`; the process's entry point turns them into
its exit code (`elastrain.runtime.entry`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from elastrain.runtime.connection import Runtime, get_runtime, init
from elastrain.runtime.cycle import GenerationCycle
from elastrain.runtime.state import State

T = TypeVar("T")


def rank() -> int:
    """This worker's rank in the current generation (joins the first generation if needed)."""
    rt = get_runtime()
    rt.ensure_group(-1)
    return rt.rank


def world_size() -> int:
    """Number of workers in the current generation (joins the first generation if needed)."""
    rt = get_runtime()
    rt.ensure_group(-1)
    return rt.world_size


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Make `func(state, ...)` elastic: it is re-entered after every membership change."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        return GenerationCycle.of(state, get_runtime()).run(func, args, kwargs)

    return wrapper


__all__ = ["GenerationCycle", "Runtime", "get_runtime", "init", "rank", "run", "world_size"]
