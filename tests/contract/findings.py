"""Unique failures from a schemathesis NDJSON event report, each with one minimal request to replay.

Every ``ScenarioFinished`` event carries a recorder: the scenario's cases, the checks run on each (with
the failure a failed one found) and the request/response of each case. A failure is identified by its
operation, its code (ST101 ...), the status the server answered and the first line of its message
(which for most checks names the kind: "Received: 500", the bad header, the schema keyword); the
shortest request among the ones that showed it is kept as the example.
"""

from __future__ import annotations

import base64
import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SHOWN = 400  # characters of a body shown in a report


@dataclass(frozen=True, order=True)
class Finding:
    """One unique failure and its smallest example."""

    operation: str  # "POST /api/v1/clusters"
    code: str  # "ST101"
    status: int  # the answer's status code
    title: str  # "Server error"
    message: str  # the failure's message (first lines)
    request: str  # "POST http://.../api/v1/clusters {body}"
    response: str  # the answer's body, cut

    @property
    def key(self) -> tuple[str, str, int, str]:
        return self.operation, self.code, self.status, self.message.splitlines()[0] if self.message else ""

    def describe(self) -> str:
        """A few lines for a test report."""
        message = " | ".join(line for line in self.message.splitlines()[:3] if line.strip())
        return (
            f"- {self.operation}: {self.code} {self.title} [{self.status}] {message}\n"
            f"    request:  {self.request}\n    response: {self.response}"
        )


def _text(payload: Any) -> str:
    """A recorded body (``{"$base64": ...}``, a string, or JSON) as text."""
    if payload is None:
        return ""
    if isinstance(payload, dict) and "$base64" in payload:
        return base64.b64decode(payload["$base64"]).decode("utf-8", errors="backslashreplace")
    return payload if isinstance(payload, str) else json.dumps(payload)


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[:_SHOWN] + f"... ({len(text)} chars)"


def _from_check(check: dict[str, Any], interaction: dict[str, Any] | None) -> Finding:
    failure = check["failure_info"]["failure"]
    request = (interaction or {}).get("request") or {}
    response = (interaction or {}).get("response") or {}
    body = _text(request.get("body"))
    return Finding(
        operation=str(failure.get("operation", "")),
        code=str(failure.get("code", check.get("name", ""))),
        status=int(response.get("status_code") or 0),
        title=str(failure.get("title", "")),
        message="\n".join(str(failure.get("message", "")).splitlines()[:4]),
        request=_cut(f"{request.get('method', '?')} {request.get('uri', '?')} {body}".strip()),
        response=_cut(_text(response.get("content"))),
    )


def read_findings(ndjson: Path) -> list[Finding]:
    """The unique failures of a run, each with its shortest request."""
    best: dict[tuple[str, str, int, str], Finding] = {}
    for line in ndjson.read_text(encoding="utf-8").splitlines():
        event = json.loads(line) if line.strip() else {}
        recorder = (event.get("ScenarioFinished") or {}).get("recorder") or {}
        interactions = recorder.get("interactions") or {}
        for case_id, checks in (recorder.get("checks") or {}).items():
            for check in checks:
                if check.get("status") != "failure" or not check.get("failure_info"):
                    continue
                found = _from_check(check, interactions.get(case_id))
                kept = best.get(found.key)
                if kept is None or len(found.request) < len(kept.request):
                    best[found.key] = found
    return sorted(best.values())


@dataclass(frozen=True)
class Known:
    """A failure accepted for now, with why: `operation` is a glob over "METHOD /path" labels."""

    operation: str
    code: str
    status: int | None  # None: whatever the server answered
    reason: str

    def matches(self, finding: Finding) -> bool:
        """Whether `finding` is this accepted failure."""
        if self.status is not None and self.status != finding.status:
            return False
        return self.code == finding.code and fnmatch.fnmatchcase(finding.operation, self.operation)
