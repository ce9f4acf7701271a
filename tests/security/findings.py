"""The attacks an issue found, by stable id, that the security suite must replay.

A test replays one (or more) with ``@pytest.mark.attack("29.fifo-log")``; the suite's summary line
says how many of each issue's attacks it replayed, and a run that collects the whole suite fails at
collection when one of them has no test (tests/security/conftest.py). Ids never change meaning: a
new finding gets a new id.
"""

from __future__ import annotations

ISSUE_29: dict[str, str] = {
    # critical
    "29.fifo-log": "a FIFO as a job's log blocked the reconciler, then every route (healthz included)",
    # high
    "29.mount-race": "a symbolic link swapped during the mount re-check put any host path in a container",
    "29.storage": "mounts were any host path: another tenant's storage, a file in the server user's home",
    "29.relay-flood": "7,000 connections to the in-container API socket took the server's descriptors",
    "29.log-bomb": "GET /clusters/{name}/logs read a whole 300 MiB container log into server memory",
    "29.lab-message": "one 200 MB WebSocket message from the tenant's lab through the portal proxy",
    "29.terminal-stall": "a portal terminal that stops reading grew server memory without bound",
    # medium
    "29.memory": "no default memory limit per container and no memory quota (3 GiB taken)",
    "29.disk": "no disk limit: 3.5 GB written to the host's root filesystem (/tmp, home, job logs)",
    "29.exec-flood": "no cap on concurrent exec streams (80: 80 host podman processes, 2.9 GB)",
    "29.running-jobs": "no cap on a tenant's running jobs (25 accepted)",
    "29.quota-race": "8 concurrent creates gave 3 clusters under a quota of 2",
    "29.priority": "tenants' container processes ran at the server's priority",
    # low
    "29.tiny-cpus": "cpus below podman's minimum accepted, then podman run retried with no backoff",
    "29.last-admin-token": "the only admin could revoke its own last token",
    "29.open-redirect": "sign-in's next= redirected off the portal (/\\evil.example, /%09/evil.example)",
    "29.egress": "host services bound to all interfaces reachable from tenant containers",
    "29.name-taken": "'name is taken' revealed another tenant's cluster names",
    "29.data-dir": "the server's data-directory path visible inside containers",
    "29.report-rate": "no rate limit on a job's progress reports",
    "29.sigterm": "SIGTERM ignored for minutes after a terminal in a deleted cluster; conmon, init left",
}

FINDINGS: dict[int, dict[str, str]] = {29: ISSUE_29}
"""Issue number -> its attacks (id -> what was found)."""


def issue_of(finding: str) -> int | None:
    """The issue whose attack `finding` is (None: no such id)."""
    return next((issue for issue, found in FINDINGS.items() if finding in found), None)
