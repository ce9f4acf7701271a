"""PNG of GPUs in use and queue length over (virtual) time, one line per policy (matplotlib, Agg)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from elastrain.scheduler.simulator import SimResult


def _thin(xs: list[float], ys: list[int], limit: int = 4000) -> tuple[list[float], list[int]]:
    """At most ~``limit`` points (every k-th step of the step function; keeps the shape)."""
    step = max(1, len(xs) // limit)
    if step == 1:
        return xs, ys
    return [*xs[::step], xs[-1]], [*ys[::step], ys[-1]]


def plot_results(results: Sequence[SimResult], path: Path, title: str = "") -> None:
    """Write the two-panel step plot to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_gpu, ax_q) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True)
    for r in results:
        t0 = r.first_submit_s
        hours = [(t - t0) / 3600.0 for t in r.series_t]
        x, y = _thin(hours, r.series_gpus)
        ax_gpu.step(x, y, where="post", label=r.policy, linewidth=0.9)
        x, y = _thin(hours, r.series_queue)
        ax_q.step(x, y, where="post", label=r.policy, linewidth=0.9)
    if results:
        ax_gpu.axhline(results[0].gpus, color="grey", linestyle=":", linewidth=0.8)
    ax_gpu.set_ylabel("GPUs in use")
    ax_q.set_ylabel("jobs queued")
    ax_q.set_xlabel("hours since first submission (virtual time)")
    ax_gpu.legend(loc="upper right")
    ax_gpu.set_title(title or "Simulated cluster")
    for ax in (ax_gpu, ax_q):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
