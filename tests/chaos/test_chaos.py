"""The chaos suite: every scenario ends with the job finished, exactly-once data, the reference parameters."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from elastrain.chaos.runner import TOLERANCE, ChaosRunner, ChaosSkipped
from elastrain.chaos.scenarios import SCENARIOS, parse_scenarios
from elastrain.errors import ConfigError

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ChaosRunner:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import mnist1d_data

    mnist1d_data.load()
    return ChaosRunner(tmp_path_factory.mktemp("chaos"), log=io.StringIO())


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_scenario(runner: ChaosRunner, name: str) -> None:
    try:
        result = runner.run(SCENARIOS[name])
    except ChaosSkipped as exc:
        pytest.skip(str(exc))
    assert result["exit_code"] == 0, (name, result)
    assert (result["duplicates"], result["missing"]) == (0, 0), result
    assert result["max_param_diff"] < TOLERANCE, result
    if name in ("kill-worker", "kill-agent"):
        assert result["steps_lost"] <= 1 and result["samples_replayed"] <= 64, result
    if name in ("stop-worker", "partition-host"):
        # dropped after missed heartbeats; when back (SIGCONT, link up) fenced, then readmitted once
        causes = [cause for _, cause in result["generations"]]
        after = result["generations"][causes.index("heartbeat_loss") + 1]
        assert after == (3, "scale_out"), result
        assert len(result["generations"]) <= 4, result  # no needless generations after the rejoin
        assert result["detect_s"] < 3 + 2, result  # within --heartbeat-timeout 3 (plus the tick)
    if name == "kill-server":  # trained on without the server; the restarted one got the late incident
        assert result["containers_adopted"], result
        assert (1, "worker_failure") in result["incidents_in_api"], result
    if name == "fill-disk":
        assert "not written" in (runner.workdir / name / "job.log").read_text()
    assert result["passed"]


def test_unknown_scenario_is_refused_with_the_valid_names() -> None:
    with pytest.raises(ConfigError, match="kill-worker"):
        parse_scenarios("kill-worker,explode")
