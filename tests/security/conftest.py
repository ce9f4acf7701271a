"""The security suite's summary line: how many replayed attacks ran and how many the platform refused.

Every test marked ``@pytest.mark.attack`` replays one attack; it passes when the platform refuses it.
At the end of a session that collected this directory, pytest prints::

    security: 27 attacks tried, 27 refused, 0 succeeded

(refused = passed, succeeded = failed; attacks whose setup failed are "errored", skipped ones are
named separately). Sanity tests (normal requests still work, the payload is real) carry no mark.
Lines a test adds to the `security_figures` fixture (the load test's latencies and RSS) follow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

ATTACK = "attack"
_FIGURES = pytest.StashKey[list[str]]()


@dataclass
class AttackTally:
    """The outcome of each attack test of the session, by node id."""

    outcomes: dict[str, str] = field(default_factory=dict)

    def record(self, report: pytest.TestReport) -> None:
        """Fold one phase report (setup, call, teardown; in any order) of an attack test into its outcome."""
        if ATTACK not in report.keywords:
            return
        node, previous = report.nodeid, self.outcomes.get(report.nodeid)
        if report.skipped:
            if previous is None:
                self.outcomes[node] = "skipped"
        elif report.when == "call":
            self.outcomes[node] = "refused" if report.passed else "succeeded"
        elif report.failed and report.when == "setup":
            self.outcomes[node] = "errored"

    def count(self, outcome: str) -> int:
        """How many attacks ended with `outcome`."""
        return sum(1 for value in self.outcomes.values() if value == outcome)

    def line(self) -> str | None:
        """The summary line (None when no attack test was collected)."""
        if not self.outcomes:
            return None
        refused, succeeded = self.count("refused"), self.count("succeeded")
        errored, skipped = self.count("errored"), self.count("skipped")
        tried = refused + succeeded + errored
        text = f"security: {tried} attacks tried, {refused} refused, {succeeded} succeeded"
        if errored:
            text += f", {errored} errored (setup failed)"
        if skipped:
            text += f"; {skipped} skipped"
        return text


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
