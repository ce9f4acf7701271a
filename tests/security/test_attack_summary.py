"""The security summary line of tests/security/conftest.py, on a throwaway suite run by a real pytest."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.findings import ISSUE_29

pytestmark = pytest.mark.timeout(60)
CONFTEST = Path(__file__).with_name("conftest.py")
REPO = Path(__file__).parents[2]
SUITE = """
import pytest

@pytest.mark.attack
def test_refused():
    pass

@pytest.mark.attack
@pytest.mark.parametrize("n", [1, 2])
def test_refused_twice(n):
    pass

@pytest.mark.attack
def test_got_through():
    assert False, "the attack worked"

@pytest.mark.attack
def test_not_here():
    pytest.skip("needs something")

@pytest.fixture
def broken():
    raise RuntimeError("setup failed")

@pytest.mark.attack
def test_setup_fails(broken):
    pass

def test_sanity(security_figures):
    security_figures.append("figure: 42 ms")
"""


def run_suite(tmp_path: Path, source: str, *args: str, whole: bool = False) -> str:
    """Run `source` as a suite beside a copy of the security conftest (`whole`: name its directory,
    as a run of the whole suite does, else its one file)."""
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    attack: an attack\n")
    (tmp_path / "test_suite.py").write_text(source)
    target = tmp_path if whole else tmp_path / "test_suite.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(target)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
        env=env,
    )
    return done.stdout + done.stderr + f"\nrc={done.returncode}"


def test_the_line_counts_refused_succeeded_errored_and_skipped(tmp_path: Path) -> None:
    out = run_suite(tmp_path, SUITE, "-q")
    assert "security: 5 attacks tried, 3 refused, 1 succeeded, 1 errored (setup failed); 1 skipped" in out, (
        out
    )


def test_all_refused_reads_zero_succeeded(tmp_path: Path) -> None:
    out = run_suite(tmp_path, SUITE, "-q", "-k", "refused or sanity")
    assert "security: 3 attacks tried, 3 refused, 0 succeeded\n" in out, out


def test_no_line_without_attack_tests(tmp_path: Path) -> None:
    out = run_suite(tmp_path, SUITE, "-q", "-k", "sanity")
    assert "1 passed" in out and "security:" not in out and "figure: 42 ms" in out, out


def replays(findings: list[str], body: str = "pass", marks: str = "") -> str:
    """A suite with one attack test replaying each of `findings`."""
    tests = [
        f'@pytest.mark.attack("{finding}")\n{marks}def test_{n}():\n    {body}\n'
        for n, finding in enumerate(findings)
    ]
    return "import pytest\n\n" + "\n".join(tests)


def test_the_line_counts_the_replays_of_issue_29(tmp_path: Path) -> None:
    out = run_suite(
        tmp_path, replays(["29.fifo-log", "29.sigterm"]) + SUITE.split("import pytest", 1)[1], "-q"
    )
    assert "(2 of issue 29's 21 replayed)" in out, out
    out = run_suite(tmp_path, replays(["29.fifo-log"], "pytest.skip('no podman')"), "-q")
    line = "security: 0 attacks tried, 0 refused, 0 succeeded; 1 skipped (0 of issue 29's 21 replayed; "
    assert line + "skipped: 29.fifo-log)" in out, out


def test_a_whole_run_with_every_finding_replayed_says_21_of_21(tmp_path: Path) -> None:
    out = run_suite(tmp_path, replays(list(ISSUE_29)), "-q", whole=True)
    assert "security: 21 attacks tried, 21 refused, 0 succeeded (21 of issue 29's 21 replayed)" in out, out
    assert out.endswith("rc=0"), out
    out = run_suite(tmp_path, replays(list(ISSUE_29)), "-q", "-k", "issue29 and test_3", whole=True)
    assert "security: 1 attacks tried, 1 refused, 0 succeeded (1 of issue 29's 21 replayed)" in out, out


def test_a_whole_run_missing_a_replay_stops_at_collection(tmp_path: Path) -> None:
    findings = [f for f in ISSUE_29 if f not in ("29.egress", "29.disk")]
    out = run_suite(tmp_path, replays(findings), "-q", whole=True)
    assert "ERROR: security: no replay of 29.disk, 29.egress" in out and out.endswith("rc=4"), out
    assert "attacks tried" not in out, out
    out = run_suite(tmp_path, replays(findings), "-q")  # one file named: a part of the suite
    assert "(19 of issue 29's 21 replayed)" in out and out.endswith("rc=0"), out


def test_an_unknown_finding_id_stops_at_collection(tmp_path: Path) -> None:
    out = run_suite(tmp_path, replays(["29.no-such-thing"]), "-q")
    assert "no finding 29.no-such-thing in tests/security/findings.py" in out and out.endswith("rc=4"), out


def test_an_xfail_replay_is_a_known_open_attack(tmp_path: Path) -> None:
    xfail = "@pytest.mark.xfail(strict=True, reason='not fixed')\n"
    out = run_suite(tmp_path, replays(["29.memory"], "assert False", xfail), "-q")
    assert "security: 1 attacks tried, 0 refused, 0 succeeded, 1 known open (xfail: 29.memory)" in out, out
    assert out.endswith("rc=0"), out
    out = run_suite(tmp_path, replays(["29.memory"], "pass", xfail), "-q")  # fixed: the mark must go
    assert "security: 1 attacks tried, 1 refused, 0 succeeded (1 of issue 29's 21 replayed)" in out, out
    assert "XPASS(strict)" in out and out.endswith("rc=1"), out
