"""Issue 29 item 3: a tenant's concurrent exec streams are bounded.

The attack: one user opened 80 exec streams at once (80 host podman processes, 2.9 GB; another
tenant's list went from 10 ms to 3.1 s). Now each user holds at most ``--max-exec-streams`` at once;
one more is a one-line 429 problem, and a slot comes back when its stream ends.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from elastrain.testing.clusters import all_running
from elastrain.testing.waits import wait_until
from tests.security.harness import new_user, refused, start_server

pytestmark = pytest.mark.timeout(120)
CAP = 3
FLOOD = 12


@pytest.mark.attack("29.exec-flood")
def test_exec_streams_beyond_the_cap_are_refused_with_429(tmp_path: Path) -> None:
    args = ("--insecure-host-commands", "--max-exec-streams", str(CAP))
    with start_server(tmp_path, args) as server:
        token = new_user(server, "streamer")
        with server.client(token) as mallory:
            mallory.create_cluster("streams", containers=2)
            mallory.wait_cluster("streams", all_running)
        body = {"command": ["sleep", "60"]}
        with server.http(token=token) as api, contextlib.ExitStack() as held:
            answers = []
            for _ in range(FLOOD):
                answer = held.enter_context(api.stream("POST", "/clusters/streams/exec", json=body))
                answers.append(answer)
                if answer.status_code != 200:
                    answer.read()
            assert [a.status_code for a in answers] == [200] * CAP + [429] * (FLOOD - CAP)
            refused(answers[-1], 429, "exec streams open", "--max-exec-streams")
            with server.http() as admin:  # the admin (another user) is not held back by this one
                assert admin.get("/clusters").status_code == 200
        # the clients went away: the server notices at its next keep-alive line, stops the commands
        # and gives the slots back
        with server.http(token=token) as api:

            def again() -> str | None:
                done = api.post("/clusters/streams/exec", json={"command": ["echo", "again"]})
                return done.text if done.status_code == 200 else None

            assert '"exit": 0' in wait_until(again, 30, "a slot to come back")
            api.delete("/clusters/streams")
