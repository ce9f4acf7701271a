"""The security summary line of tests/security/conftest.py, on a throwaway suite run by a real pytest."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)
CONFTEST = Path(__file__).with_name("conftest.py")
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


def run_suite(tmp_path: Path, source: str, *args: str) -> str:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    attack: an attack\n")
    (tmp_path / "test_suite.py").write_text(source)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=50,
        cwd=tmp_path,
    )
    return done.stdout + done.stderr


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
