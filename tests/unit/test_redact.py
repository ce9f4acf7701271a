"""`elastrain.server.redact`: the server's directories leave the API only as platform-relative names."""

from __future__ import annotations

from pathlib import Path

from elastrain.server.redact import mountinfo_warning, redact, redact_value, register


def test_paths_under_the_data_dir_and_storage_root_are_renamed(tmp_path: Path) -> None:
    data = tmp_path / "srv-data"
    register(data, data / "storage")
    refused = f"{data}/clusters/c/jobs/1.log is not a regular file (fifo): not read"
    assert redact(refused) == "DATA-DIR/clusters/c/jobs/1.log is not a regular file (fifo): not read"
    assert redact(f"mount source {data}/storage/u2/ckpt now leads elsewhere") == (
        "mount source storage:ckpt now leads elsewhere"
    )
    assert redact(f"statfs {data}/storage/u7/ab/c: no such file") == "statfs storage:ab/c: no such file"
    assert redact(f"'{data}/storage'") == "'STORAGE-ROOT'"
    assert redact(f"{data}") == "DATA-DIR"


def test_a_longer_name_beside_the_root_and_other_text_stay(tmp_path: Path) -> None:
    data = tmp_path / "data"
    register(data)
    for text in (f"{data}2/x", f"{data}-old", "/etc/mpi/hostfile", "no path at all", ""):
        assert redact(text) == text


def test_an_events_detail_is_redacted_throughout(tmp_path: Path) -> None:
    data = tmp_path / "d"
    register(data, tmp_path / "areas")
    detail = {"reason": f"podman: statfs {data}/clusters/x/keys", "n": 3, "hosts": [f"{tmp_path}/areas/u1/z"]}
    assert redact_value(detail) == {
        "reason": "podman: statfs DATA-DIR/clusters/x/keys",
        "n": 3,
        "hosts": ["storage:z"],
    }


def test_the_mountinfo_warning_names_a_directory_that_is_no_filesystem_root(tmp_path: Path) -> None:
    warning = mountinfo_warning(tmp_path / "data", tmp_path / "data" / "storage")
    assert warning is not None and str(tmp_path / "data") in warning and "/proc/self/mountinfo" in warning
    assert mountinfo_warning(Path("/"), Path("/")) is None  # a filesystem's root: nothing above it shows
