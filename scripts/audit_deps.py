#!/usr/bin/env python3
"""`make audit`: pip-audit over the installed dependencies (a step of `make test`).

The environment's packages are frozen (``pip freeze --all --exclude-editable``: elastrain itself is
local and never audited; a local version such as torch's ``2.13.0+cpu`` is audited as ``2.13.0``) and
handed to pip-audit as pinned requirements (``--no-deps --disable-pip``: nothing is installed).

- known vulnerabilities: the report is printed and the exit status is 1, unless every finding is
  listed in ``.ci/pip-audit-ignore.txt`` (``ID  reason`` per line, for ones with no fix yet);
- the advisory database cannot be reached (no network, DNS failure, timeout, or no package could be
  looked up): one line ``pip-audit: skipped (advisory database unreachable: ...)`` and exit status 0.

Usage: ``.venv/bin/python scripts/audit_deps.py [--ignore-file F] [--service pypi|osv]``.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IGNORE_FILE = REPO / ".ci" / "pip-audit-ignore.txt"
TIMEOUT_S = 240  # the whole audit; each request has pip-audit's --timeout
_UNREACHABLE = re.compile(
    r"ConnectionError|NameResolution|Name or service not known|Temporary failure in name resolution|"
    r"Max retries exceeded|timed out|Timeout|Network is unreachable|Connection refused|SSLError|"
    r"ServiceError",
    re.IGNORECASE,
)
_NOT_FOUND = "not found on PyPI"


class ConfigError(Exception):
    """A malformed ignore file."""


@dataclass
class Outcome:
    """What `make audit` says and its exit status."""

    status: int
    lines: list[str] = field(default_factory=list)


def read_ignores(path: Path) -> dict[str, str]:
    """``{vulnerability id: reason}`` from the ignore file (missing file: none); a reason is required."""
    if not path.exists():
        return {}
    ignores: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        vuln_id, _, reason = line.partition(" ")
        if not reason.strip():
            raise ConfigError(f"{path}:{number}: {vuln_id} needs a reason (ID  reason)")
        ignores[vuln_id] = reason.strip()
    return ignores


def frozen_requirements(freeze_output: str) -> tuple[list[str], list[str]]:
    """Pinned ``name==version`` lines (local versions dropped) and the entries that cannot be audited."""
    pins: list[str] = []
    unpinned: list[str] = []
    for raw in freeze_output.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        if not sep:  # "name @ file:///..." and the like: not a PyPI release
            unpinned.append(line.split(" ", 1)[0])
            continue
        pins.append(f"{name.strip()}=={version.strip().split('+', 1)[0]}")
    return pins, unpinned


def summarize(report: dict, ignores: dict[str, str], unpinned: list[str]) -> Outcome:
    """The verdict on pip-audit's JSON report."""
    deps = report.get("dependencies", [])
    skipped = [d for d in deps if d.get("skip_reason")]
    audited = [d for d in deps if not d.get("skip_reason")]
    if deps and not audited and all(_NOT_FOUND in str(d["skip_reason"]) for d in skipped):
        return Outcome(
            0,
            [
                "pip-audit: skipped (advisory database unreachable: none of the "
                f"{len(deps)} packages could be looked up, e.g. {skipped[0]['skip_reason']})"
            ],
        )
    findings = [(d, v) for d in audited for v in d.get("vulns", []) if v.get("id") not in ignores]
    lines: list[str] = []
    if findings:
        lines.append(f"pip-audit: {len(findings)} known vulnerabilities:")
        lines.append(f"  {'Name':<24} {'Version':<14} {'ID':<22} Fix versions / aliases")
        for dep, vuln in findings:
            fixes = ", ".join(vuln.get("fix_versions", [])) or "no fix yet"
            aliases = ", ".join(vuln.get("aliases", []))
            lines.append(
                f"  {dep['name']:<24} {dep['version']:<14} {vuln['id']:<22} {fixes}"
                + (f" ({aliases})" if aliases else "")
            )
        lines.append(
            "upgrade them (constraints.txt / pyproject.toml); only where no fix exists, list the ID with a "
            f"reason in {IGNORE_FILE.relative_to(REPO)}"
        )
        return Outcome(1, lines)
    ignored = sorted({v["id"] for d in audited for v in d.get("vulns", []) if v.get("id") in ignores})
    note = f"; ignored as listed: {', '.join(ignored)}" if ignored else ""
    lines.append(f"pip-audit: no known vulnerabilities in {len(audited)} packages{note}")
    cannot = [str(d["name"]) for d in skipped] + unpinned
    if cannot:
        lines.append(f"pip-audit: not audited (not on PyPI): {', '.join(sorted(cannot))}")
    return Outcome(0, lines)


def run_audit(python: str, ignores: dict[str, str], service: str, timeout_s: float) -> Outcome:
    """Freeze the environment of `python`, run pip-audit on it, and judge the result."""
    freeze = subprocess.run(
        [python, "-m", "pip", "freeze", "--all", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    pins, unpinned = frozen_requirements(freeze.stdout)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="elastrain-audit-") as reqs:
        reqs.write("\n".join(pins) + "\n")
        reqs.flush()
        argv = [python, "-m", "pip_audit", "-r", reqs.name, "--no-deps", "--disable-pip"]
        argv += ["--format", "json", "--progress-spinner", "off", "--timeout", "15", "-s", service]
        for vuln_id in ignores:
            argv += ["--ignore-vuln", vuln_id]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            why = f"no answer in {timeout_s:.0f} s"
            return Outcome(0, [f"pip-audit: skipped (advisory database unreachable: {why})"])
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        report = None
    if report is None:
        errors = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = errors[-1] if errors else f"exit status {proc.returncode}"
        if _UNREACHABLE.search(proc.stderr):
            return Outcome(0, [f"pip-audit: skipped (advisory database unreachable: {last[:200]})"])
        return Outcome(2, [f"pip-audit failed (exit status {proc.returncode}):", *errors[-20:]])
    return summarize(report, ignores, unpinned)


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ignore-file", type=Path, default=IGNORE_FILE)
    parser.add_argument("--service", choices=("pypi", "osv"), default="pypi", help="advisory database")
    parser.add_argument("--python", default=sys.executable, help="the environment to audit")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds for the whole audit")
    args = parser.parse_args(argv)
    try:
        ignores = read_ignores(args.ignore_file)
    except ConfigError as exc:
        print(f"pip-audit: {exc}", file=sys.stderr)
        return 2
    outcome = run_audit(args.python, ignores, args.service, args.timeout)
    for line in outcome.lines:
        print(line, file=sys.stderr if outcome.status else sys.stdout)
    return outcome.status


if __name__ == "__main__":
    sys.exit(main())
