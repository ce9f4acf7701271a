"""Issue 29 item 3: quotas are checked and taken atomically.

The attack: 8 concurrent creates by one user with a quota of 2 clusters gave them 3 (each request
counted before any wrote). The check and the insert are now one transaction holding the user's lock
(SQLite's write lock, the user's row on PostgreSQL): exactly 2 are created, the rest refused (403).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.security.harness import new_user, refused, start_server

pytestmark = pytest.mark.timeout(120)
RACERS = 8


@pytest.mark.attack("29.quota-race")
@pytest.mark.parametrize("database", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_concurrent_creates_cannot_pass_the_cluster_quota(
    tmp_path: Path, database: str, request: pytest.FixtureRequest
) -> None:
    db_url = request.getfixturevalue("postgres").new_database() if database == "postgres" else None
    with start_server(tmp_path, db_url=db_url) as server:
        token = new_user(server, "racer")
        with server.http() as admin:
            assert admin.patch("/users/racer", json={"quota": {"clusters": 2}}).status_code == 200

        def create(i: int) -> tuple[int, str]:
            with server.http(token=token) as api:
                answer = api.post("/clusters", json={"name": f"race-{i}", "containers": 2})
                return answer.status_code, answer.text

        with ThreadPoolExecutor(RACERS) as pool:
            answers = list(pool.map(create, range(RACERS)))
        codes = sorted(code for code, _ in answers)
        assert codes == [201, 201] + [403] * (RACERS - 2), answers
        with server.http(token=token) as api:
            assert len(api.get("/clusters").json()) == 2
            refused(api.post("/clusters", json={"name": "race-late", "containers": 2}), 403, "quota exceeded")
            for cluster in api.get("/clusters").json():
                api.delete(f"/clusters/{cluster['name']}")
