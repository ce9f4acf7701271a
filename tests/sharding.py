"""Split a pytest run into balanced shares that run at once (`make test`'s second lane), as a plugin.

    pytest -p tests.sharding --shard 1/2 tests/integration ...   # the first of two shares
    pytest -p tests.sharding --record-durations d.json ...        # measure, to balance the next runs

A share is a set of whole test modules (a module-scoped fixture, e.g. a container cluster, is never set
up in two processes), chosen greedily, longest first, so that every share gets about the same number of
seconds by `tests/durations.json` (seconds per test id, from an earlier recorded run; a test not listed
counts `DEFAULT_SECONDS`). Tests marked `serial` (load-sensitive: they measure latencies) are in no
share: `make test` runs them alone afterwards with `-m serial`. Without `--shard` nothing changes.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
DEFAULT_SECONDS = 5.0


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sharding", "running a share of the suite (tests/sharding.py)")
    group.addoption(
        "--shard", metavar="K/N", help="run only the K-th of N balanced shares of the selected tests"
    )
    group.addoption(
        "--record-durations",
        metavar="FILE",
        help="write each test's seconds (setup + call + teardown) to FILE",
    )


def parse_shard(text: str) -> tuple[int, int]:
    """`K/N` -> (K, N), 1 <= K <= N; a UsageError that says the form otherwise."""
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {text!r}: expected K/N, e.g. --shard 1/2") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {text!r}: K must be between 1 and N, e.g. --shard 1/2")
    return k, n


def module_of(item: pytest.Item) -> str:
    """The test module's node id (`tests/x/test_y.py`)."""
    return item.nodeid.split("::", 1)[0]


def assign(costs: dict[str, float], shards: int) -> list[list[str]]:
    """Modules into `shards` lists of about equal total cost (longest first onto the lightest share)."""
    loads, shares = [0.0] * shards, [list[str]() for _ in range(shards)]
    for module in sorted(costs, key=lambda m: (-costs[m], m)):
        lightest = min(range(shards), key=lambda i: (loads[i], i))
        loads[lightest] += costs[module]
        shares[lightest].append(module)
    return shares


def known_durations() -> dict[str, float]:
    """tests/durations.json (test id -> seconds); empty when missing or unreadable."""
    try:
        data = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected their tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = config.getoption("shard")
    if not spec:
        return
    k, n = parse_shard(spec)
    known = known_durations()
    costs: dict[str, float] = defaultdict(float)
    for item in items:
        if item.get_closest_marker("serial") is None:
            costs[module_of(item)] += known.get(item.nodeid, DEFAULT_SECONDS)
    mine = set(assign(dict(costs), n)[k - 1])
    kept = [i for i in items if module_of(i) in mine and i.get_closest_marker("serial") is None]
    deselected = [i for i in items if i not in kept]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


class DurationRecorder:
    """Adds up each test's phases and writes them at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        rounded = {nodeid: round(s, 1) for nodeid, s in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(rounded, indent=1) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    path = config.getoption("record_durations")
    if path:
        config.pluginmanager.register(DurationRecorder(Path(path)), "sharding-recorder")
