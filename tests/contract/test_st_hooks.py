"""The contract test's request rewrites keep a request as valid or as invalid as it was, and harmless."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from tests.contract.st_hooks import (
    CAP_CONTAINERS,
    MAX_DB_INT,
    SAFE_PROGRAM,
    Harness,
    as_server_int,
    attach_body,
    capped_count,
    distinct_mount_targets,
    exec_stream,
    future_expiry,
    harmless_command,
    job_report,
    listed_image,
    ndjson_lines,
    ordered_bounds,
    protected_job,
    shm_within_memory,
    with_header,
)

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)
HARNESS = Harness(
    api_url="http://x/api/v1", cluster="st-harness", job_id=5, job_token="tok", attach_token="att",
    attach_pid=4242, sleeper_job=6,
)  # fmt: skip
EXEC_LINE = {
    "type": "object",
    "properties": {"out": {"type": "string"}, "exit": {"type": "integer"}},
    "minProperties": 1,
    "maxProperties": 1,
    "additionalProperties": False,
}


def test_commands_become_echo_of_every_fuzzed_item() -> None:
    assert harmless_command(["rm", "-rf", "/"]) == [SAFE_PROGRAM, "rm", "-rf", "/"]
    assert harmless_command(["a\x00b"]) == [SAFE_PROGRAM, "a\x00b"]  # NUL still reaches the server
    assert harmless_command(["x", 1]) == [SAFE_PROGRAM, "x", 1]  # still invalid
    assert harmless_command([]) == []  # still invalid (at least one item)
    assert harmless_command("rm -rf /") == "rm -rf /"  # not a list: refused whatever it holds


def test_container_counts_are_capped_monotonically() -> None:
    assert capped_count(64) == CAP_CONTAINERS and capped_count(30.0) == CAP_CONTAINERS
    assert capped_count(2) == 2 and capped_count(CAP_CONTAINERS) == CAP_CONTAINERS
    for invalid in (0, 1, 65, 10**20, -5, True, "3", 2.5):
        assert capped_count(invalid) == invalid
    values = [-1, 0, 2, 3, 4, 10, 64, 65, 1000]
    capped = [capped_count(v) for v in values]
    assert capped == sorted(capped)


def test_bounds_are_put_on_the_right_side_of_containers() -> None:
    assert ordered_bounds({"min_containers": 25, "max_containers": 1, "containers": 3}) == {
        "min_containers": 3,
        "max_containers": 3,
        "containers": 3,
    }
    assert ordered_bounds({"min_containers": 25.0})["min_containers"] == 2  # the default count
    kept = {"min_containers": 2, "max_containers": 8, "containers": 4}
    assert ordered_bounds(kept) == kept
    assert ordered_bounds({"containers": "x", "min_containers": 9})["min_containers"] == 9


def test_an_image_not_served_for_the_framework_becomes_the_default() -> None:
    images = [{"name": "img:1", "frameworks": ["pytorch"]}, {"name": "local", "frameworks": []}]
    assert listed_image({"image": "img:1", "framework": "pytorch"}, images)["image"] == "img:1"
    assert listed_image({"image": "img:1"}, images)["image"] == ""  # the default framework: horovod
    assert listed_image({"image": "local", "framework": "deepspeed"}, images)["image"] == "local"
    assert listed_image({"image": "nope"}, images)["image"] == ""
    for kept in ({"image": ""}, {"name": "a"}, {"image": 7}):
        assert listed_image(kept, images) == kept


def test_expiry_times_are_moved_into_the_allowed_window() -> None:
    tomorrow = "2030-01-02T00:00:00Z"
    assert future_expiry("2000-01-01T00:00:00Z", NOW) == tomorrow
    assert future_expiry("7692-07-16T11:40:35-16:24", NOW) == tomorrow
    assert future_expiry("2031-06-01T00:00:00+02:00", NOW) == "2031-06-01T00:00:00+02:00"
    assert future_expiry("2000-01-01t00:00:00z", NOW) == tomorrow  # RFC 3339: either case
    assert future_expiry("2000-01-01T00:00:00", NOW) == "2000-01-01T00:00:00"  # no zone: invalid
    assert future_expiry("soon", NOW) == "soon" and future_expiry(None, NOW) is None


def test_token_ids_are_read_as_the_server_reads_them() -> None:
    assert [as_server_int(v) for v in ("1", "01", " 1", "1.0", 7)] == [1, 1, 1, 1, 7]
    assert as_server_int("one") is None and as_server_int("1e0") is None


def test_a_memory_limit_below_the_shm_becomes_the_shm() -> None:
    assert shm_within_memory({"memory": "1K"}) == {"memory": "64Mi"}  # the default shm
    assert shm_within_memory({"memory": "1K", "shm": "2Gi"}) == {"memory": "2Gi", "shm": "2Gi"}
    for body in ({"memory": "4Gi"}, {"memory": ""}, {"memory": "lots"}, {"shm": "1Gi"}):
        assert shm_within_memory(body) == body  # within, no limit, invalid (left alone), no memory


def test_mounts_keep_the_first_of_each_target() -> None:
    body = {"mounts": ["/a:/x", "/b://x/", "/c:/y", 7, 7]}
    assert distinct_mount_targets(body) == {"mounts": ["/a:/x", "/c:/y", 7, 7]}  # non-strings: as sent
    assert distinct_mount_targets({"mounts": "/a:/x"}) == {"mounts": "/a:/x"}


def test_job_reports_carry_the_harness_jobs_token_and_id() -> None:
    params, headers = job_report({"job_id": 99}, {"x-job-token": "fuzzed", "Other": "1"}, HARNESS)
    assert params == {"job_id": 5} and headers == {"Other": "1", "X-Job-Token": "tok"}
    assert job_report({"job_id": MAX_DB_INT}, None, HARNESS)[0] == {"job_id": 5}
    for invalid in (0, -1, MAX_DB_INT + 1, "abc", True, 1.5):  # an invalid id stays invalid
        assert job_report({"job_id": invalid}, None, HARNESS)[0] == {"job_id": invalid}
    assert with_header({"X-JOB-TOKEN": "a"}, "X-Job-Token", "b") == {"X-Job-Token": "b"}


def test_an_attach_names_the_sleeper_when_its_pid_is_valid() -> None:
    assert attach_body({"command": ["x"], "pid": 1}, HARNESS) == {"command": ["x"], "pid": 4242}
    for invalid in (0, -5, 2**31, "1", None):
        assert attach_body({"command": ["x"], "pid": invalid}, HARNESS)["pid"] == invalid
    assert attach_body([1], HARNESS) == [1] and attach_body({"command": ["x"]}, HARNESS) == {"command": ["x"]}


def test_the_sleeper_and_the_jobs_attached_to_it_are_never_cancelled() -> None:
    pids = {6: 4242, 7: 4242, 8: 1000}
    assert [protected_job(v, HARNESS, pids.get) for v in (6, "07", 8, 9, "x")] == [
        True,
        True,
        False,
        False,
        False,
    ]
    assert not protected_job(6, Harness(), pids.get)  # no harness: nothing protected


def test_an_exec_stream_is_checked_line_by_line() -> None:
    lines = ndjson_lines(b'{"out": "a"}\n\n{"out": "b"}\n{"exit": 3}\n')
    assert exec_stream(lines, EXEC_LINE) == {"exit": 3}
    assert exec_stream([{"out": 1}, {"exit": 0}], EXEC_LINE) == {"out": 1}  # the schema check sees it
    assert exec_stream([{"out": "a", "exit": 0}], EXEC_LINE) == {"out": "a", "exit": 0}
    for bad in ([], [{"out": "a"}], [{"exit": 0}, {"out": "a"}], [{"exit": 0}, {"exit": 0}]):
        with pytest.raises(ValueError):
            exec_stream(bad, EXEC_LINE)
    with pytest.raises(ValueError):
        ndjson_lines(b'{"out": "a"}\nnot json\n')
