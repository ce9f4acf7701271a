"""How many ranks a job can use, read from its command: ``elastrain run`` / ``horovodrun`` with
``--min-np A --max-np B`` (elastic), ``-np N`` (fixed), or neither (unknown: treated as fixed).

The control plane's elastic scheduler lets a cluster's size follow its running job's range (see
:mod:`elastrain.server.cluster_demand`); this module only reads the range.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

LAUNCHERS = frozenset({"horovodrun", "elastrain-run"})
_FIXED = ("-np", "--num-proc", "--nproc")
_MIN = ("--min-np", "--min-num-proc")
_MAX = ("--max-np", "--max-num-proc")


@dataclass(frozen=True, slots=True)
class RankRange:
    """A job's ranks: ``low..high`` (equal for a fixed-size job)."""

    low: int
    high: int

    @property
    def elastic(self) -> bool:
        """Whether the job can change its size."""
        return self.high > self.low

    def containers(self, slots: int) -> tuple[int, int]:
        """Containers (launcher included: it runs ranks too) of ``slots`` ranks each for low and high."""
        per = max(slots, 1)
        return math.ceil(self.low / per), math.ceil(self.high / per)


def _value(argv: Sequence[str], i: int, names: tuple[str, ...]) -> int | None:
    arg = argv[i]
    for name in names:
        text = argv[i + 1] if arg == name and i + 1 < len(argv) else None
        if arg.startswith(name + "="):
            text = arg.partition("=")[2]
        if text is not None:
            return int(text) if text.isdigit() and int(text) > 0 else None
    return None


def rank_range(argv: Sequence[str]) -> RankRange | None:
    """The rank range of a job command, or None when it names no rank count.

    The options are read only after a launcher (``elastrain run``, ``horovodrun``) and before its
    training command; ``--min-np`` alone means up to ``-np`` (or the minimum), ``--max-np`` alone
    from 1."""
    words = list(argv)
    start = next(
        (
            i + 1
            for i, w in enumerate(words)
            if w.rsplit("/", 1)[-1] in LAUNCHERS
            or (w.rsplit("/", 1)[-1] == "elastrain" and words[i + 1 : i + 2] == ["run"])
        ),
        None,
    )
    if start is None:
        return None
    if words[start : start + 1] == ["run"]:
        start += 1
    fixed = low = high = None
    for i in range(start, len(words)):
        if not words[i].startswith("-"):
            if i > start and words[i - 1].startswith("-") and "=" not in words[i - 1]:
                continue  # an option's value
            break  # the training command begins
        fixed = _value(words, i, _FIXED) or fixed
        low = _value(words, i, _MIN) or low
        high = _value(words, i, _MAX) or high
    if low is None and high is None:
        return RankRange(fixed, fixed) if fixed else None
    low = low or 1
    high = high or fixed or low
    return RankRange(min(low, high), max(low, high))
