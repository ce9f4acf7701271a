"""The security suite's summary line: how many replayed attacks ran and how many the platform refused.

Every test marked ``@pytest.mark.attack`` replays one attack; it passes when the platform refuses it.
At the end of a session that collected this directory, pytest prints::

    security: 27 attacks tried, 27 refused, 0 succeeded (21 of issue 29's 21 replayed)

(refused = passed, succeeded = failed; attacks whose setup failed are "errored", skipped ones are
named separately; an attack marked ``xfail``, a finding not fixed yet, is "known open" when it still
works). An attack an issue found is named by its stable id in the mark,
``@pytest.mark.attack("29.fifo-log")`` (tests/security/findings.py); the line counts the issue's
attacks whose replay ran, and a session that collects this whole directory stops at collection
when one of them has no replay. ``-k issue29`` selects the replays of issue 29. Sanity tests
(normal requests still work, the payload is real) carry no mark. Lines a test adds to the
`security_figures` fixture (the load tests' latencies and RSS) follow it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from tests.security.findings import FINDINGS, issue_of

ATTACK = "attack"
REPLAYS = "replays"  # a user property of each attack test: the finding ids it replays
TRIED = ("refused", "succeeded", "open", "errored")
_FIGURES = pytest.StashKey[list[str]]()


@dataclass
class AttackTally:
    """The outcome of each attack test of the session, by node id, and the findings each replays."""

    outcomes: dict[str, str] = field(default_factory=dict)
    replays: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def record(self, report: pytest.TestReport) -> None:
        """Fold one phase report (setup, call, teardown; in any order) of an attack test into its outcome."""
        if ATTACK not in report.keywords:
            return
        node, previous = report.nodeid, self.outcomes.get(report.nodeid)
        for name, value in report.user_properties:
            if name == REPLAYS:
                self.replays[node] = tuple(str(v) for v in cast(Iterable[object], value))
        if report.when == "call" and (hasattr(report, "wasxfail") or _strict_xpass(report)):
            # xfail: the attack still works and is known to (a finding not fixed yet); a strict
            # XPASS fails the run, but the attack was refused
            self.outcomes[node] = "open" if report.skipped else "refused"
        elif report.skipped:
            if previous is None:
                self.outcomes[node] = "skipped"
        elif report.when == "call":
            self.outcomes[node] = "refused" if report.passed else "succeeded"
        elif report.failed and report.when == "setup":
            self.outcomes[node] = "errored"

    def count(self, outcome: str) -> int:
        """How many attacks ended with `outcome`."""
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def named(self, outcome: str) -> list[str]:
        """The attacks that ended with `outcome`, by the findings they replay (else their node id)."""
        names: set[str] = set()
        for node, value in self.outcomes.items():
            if value == outcome:
                names.update(self.replays.get(node) or (node,))
        return sorted(names)

    def replayed(self, issue: int) -> tuple[set[str], set[str]]:
        """Issue `issue`'s findings whose replay ran (whatever its outcome), and those only skipped."""
        ran: set[str] = set()
        skipped: set[str] = set()
        for node, findings in self.replays.items():
            mine = {f for f in findings if issue_of(f) == issue}
            (ran if self.outcomes.get(node) in TRIED else skipped).update(mine)
        return ran, skipped - ran

    def line(self) -> str | None:
        """The summary line (None when no attack test was collected)."""
        if not self.outcomes:
            return None
        refused, succeeded = self.count("refused"), self.count("succeeded")
        errored, skipped, known = self.count("errored"), self.count("skipped"), self.count("open")
        tried = refused + succeeded + known + errored
        text = f"security: {tried} attacks tried, {refused} refused, {succeeded} succeeded"
        if known:
            text += f", {known} known open (xfail: {', '.join(self.named('open'))})"
        if errored:
            text += f", {errored} errored (setup failed)"
        if skipped:
            text += f"; {skipped} skipped"
        for issue, found in FINDINGS.items():
            ran, only_skipped = self.replayed(issue)
            if ran or only_skipped:
                text += f" ({len(ran)} of issue {issue}'s {len(found)} replayed"
                text += f"; skipped: {', '.join(sorted(only_skipped))})" if only_skipped else ")"
        return text


def _strict_xpass(report: pytest.TestReport) -> bool:
    """Whether `report` is an ``xfail(strict=True)`` test that passed (pytest fails it)."""
    return report.failed and str(report.longrepr).startswith("[XPASS(strict)]")


def findings_of(item: pytest.Item) -> tuple[str, ...]:
    """The finding ids an attack test replays (the positional arguments of its attack marks)."""
    return tuple(str(arg) for mark in item.iter_markers(ATTACK) for arg in mark.args)


def missing_replays(replayed: Iterable[str]) -> list[str]:
    """The findings of every issue that no test replays."""
    done = set(replayed)
    return [finding for found in FINDINGS.values() for finding in found if finding not in done]


def _collects_this_directory(config: pytest.Config) -> bool:
    """Whether the session's arguments name this directory or one above it (all of it is collected)."""
    here = Path(__file__).parent.resolve()
    for arg in config.args:
        path = (config.invocation_params.dir / arg.split("::")[0]).resolve()
        if path == here or path in here.parents:
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before -k, -m and the shards deselect: every test of the session
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tag each replay with its findings (checked to exist); with this whole directory collected, stop
    the session when a finding has no replay."""
    replayed: set[str] = set()
    for item in items:
        findings = findings_of(item)
        unknown = [f for f in findings if issue_of(f) is None]
        if unknown:
            raise pytest.UsageError(
                f"{item.nodeid}: no finding {', '.join(unknown)} in tests/security/findings.py; "
                "use one of its ids or add the finding there"
            )
        if findings:
            item.user_properties.append((REPLAYS, findings))
            item.extra_keyword_matches.update(f"issue{issue_of(f)}" for f in findings)
            replayed.update(findings)
    missing = missing_replays(replayed)
    if missing and _collects_this_directory(config):
        raise pytest.UsageError(
            f"security: no replay of {', '.join(missing)}: each attack in tests/security/findings.py "
            'needs a test marked @pytest.mark.attack("<id>") in tests/security'
        )


@pytest.fixture
def security_figures(request: pytest.FixtureRequest) -> list[str]:
    """Lines to print under the summary line (figures worth seeing without ``-s``)."""
    return request.config.stash.setdefault(_FIGURES, [])


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the security line after pytest's own summary (from the reports pytest keeps)."""
    tally = AttackTally()
    for reports in terminalreporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                tally.record(report)
    line = tally.line()
    if line is not None:
        succeeded = tally.count("succeeded")
        terminalreporter.write_line(line, red=bool(succeeded), green=not succeeded, bold=True)
    for figure in terminalreporter.config.stash.get(_FIGURES, []):
        terminalreporter.write_line(figure)
