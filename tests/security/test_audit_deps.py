"""`make audit` (scripts/audit_deps.py): fails on known vulnerabilities, skips (one line) when the
advisory database is unreachable, honours the documented ignore file. pip and pip-audit are replaced by
a fake interpreter so every outcome is exercised offline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "audit_deps.py"
FREEZE = "numpy==2.1.0\ntorch==2.13.0+cpu\nlocalpkg @ file:///src/localpkg\nrequests==2.25.0\n"
FAKE_PYTHON = r"""#!{python}
import json, os, sys
args = sys.argv[1:]
if args[:2] == ["-m", "pip"]:
    print(os.environ["FAKE_FREEZE"], end="")
    sys.exit(0)
assert args[:2] == ["-m", "pip_audit"], args
requirements = open(args[args.index("-r") + 1]).read()
json.dump({{"args": args, "requirements": requirements}}, open(os.environ["FAKE_RECORD"], "w"))
mode = os.environ["FAKE_MODE"]
if mode == "offline":
    print("Traceback ...\nrequests.exceptions.ConnectionError: HTTPSConnectionPool(host='pypi.org', "
          "port=443): Max retries exceeded", file=sys.stderr)
    sys.exit(1)
if mode == "broken":
    print("pip-audit: error: unrecognized arguments", file=sys.stderr)
    sys.exit(2)
names = [line.split("==")[0] for line in requirements.split()]
if mode == "notfound":
    deps = [{{"name": n, "skip_reason": f"Dependency not found on PyPI and could not be audited: {{n}}"}}
            for n in names]
else:
    deps = [{{"name": n, "version": "1", "vulns": []}} for n in names]
    if mode == "vuln":
        vulns = [{{"id": "PYSEC-2023-74", "fix_versions": ["2.31.0"], "aliases": ["CVE-2023-32681"]}},
                 {{"id": "GHSA-ignored-0000", "fix_versions": [], "aliases": []}}]
        deps[-1]["vulns"] = [v for v in vulns if v["id"] not in args]
print(json.dumps({{"dependencies": deps, "fixes": []}}))
sys.exit(1 if any(d.get("vulns") for d in deps) else 0)
"""


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("audit_deps", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it is executed
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    python = tmp_path / "python"
    python.write_text(FAKE_PYTHON.format(python=sys.executable))
    python.chmod(0o755)
    monkeypatch.setenv("FAKE_FREEZE", FREEZE)
    monkeypatch.setenv("FAKE_RECORD", str(tmp_path / "record.json"))
    return python


def audit(fake: Path, mode: str, ignore: str = "") -> tuple[int, str, dict[str, object]]:
    ignore_file = fake.parent / "ignore.txt"
    ignore_file.write_text(ignore)
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--python", str(fake), "--ignore-file", str(ignore_file)],
        capture_output=True,
        text=True,
        timeout=50,
        env={**os.environ, "FAKE_MODE": mode},
    )
    path = fake.parent / "record.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    return done.returncode, done.stdout + done.stderr, record


def test_a_known_vulnerability_fails_with_the_report(fake: Path) -> None:
    status, out, record = audit(fake, "vuln")
    assert status == 1, out
    assert "PYSEC-2023-74" in out and "requests" in out and "2.31.0" in out and "CVE-2023-32681" in out
    assert "GHSA-ignored-0000" in out and "no fix yet" in out
    # pinned versions only; the local version suffix dropped; the direct-URL package left out
    assert str(record["requirements"]).split() == ["numpy==2.1.0", "torch==2.13.0", "requests==2.25.0"]
    args = record["args"]
    assert isinstance(args, list) and "--no-deps" in args and "--disable-pip" in args


def test_listed_ids_are_ignored_with_their_reason(fake: Path) -> None:
    ignore = "# comment\nGHSA-ignored-0000  no fixed release yet; the parser is unused\n"
    status, out, record = audit(fake, "vuln", ignore)
    assert status == 1 and "GHSA-ignored-0000" not in out and "PYSEC-2023-74" in out, out
    assert "GHSA-ignored-0000" in list(record["args"])  # type: ignore[call-overload]
    status, out, _ = audit(fake, "vuln", ignore + "PYSEC-2023-74  fixed upstream, pinned by torch\n")
    assert status == 0 and "no known vulnerabilities in 3 packages" in out, out


def test_an_id_without_a_reason_is_refused(fake: Path) -> None:
    status, out, _ = audit(fake, "clean", "PYSEC-2023-74\n")
    assert status == 2 and "needs a reason" in out, out


@pytest.mark.parametrize("mode", ["offline", "notfound"])
def test_an_unreachable_database_skips_with_one_line(fake: Path, mode: str) -> None:
    status, out, _ = audit(fake, mode)
    assert status == 0, out
    [line] = out.strip().splitlines()
    assert line.startswith("pip-audit: skipped (advisory database unreachable: "), line


def test_clean_and_broken_runs(fake: Path) -> None:
    status, out, _ = audit(fake, "clean")
    assert status == 0 and "no known vulnerabilities in 3 packages" in out
    assert "not audited (not on PyPI): localpkg" in out
    status, out, _ = audit(fake, "broken")
    assert status == 2 and "unrecognized arguments" in out, out


def test_summary_of_a_partial_lookup() -> None:
    module = load_script()
    report = {
        "dependencies": [
            {"name": "a", "version": "1", "vulns": []},
            {"name": "private", "skip_reason": "Dependency not found on PyPI and could not be audited"},
        ]
    }
    outcome = module.summarize(report, {}, [])
    assert outcome.status == 0
    assert outcome.lines == [
        "pip-audit: no known vulnerabilities in 1 packages",
        "pip-audit: not audited (not on PyPI): private",
    ]
