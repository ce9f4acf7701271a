"""Input checks of the control plane: names, sizes, counts, frameworks, mounts."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastrain.server.errors import Conflict, Forbidden, InvalidRequest
from elastrain.server.validation import (
    check_containers,
    check_framework,
    check_name,
    format_size,
    parse_mount,
    parse_size,
)


@pytest.mark.parametrize(
    "text,expected",
    [("512Mi", 512 * 2**20), ("2Gi", 2 * 2**30), ("1G", 10**9), ("1024", 1024), ("1.5Gi", 3 * 2**29)],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "1Xi", "-1Gi", "1 G B"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(InvalidRequest, match="512Mi"):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(2**30) == "1Gi" and format_size(512 * 2**20) == "512Mi" and format_size(1000) == "1000"


@pytest.mark.parametrize("name", ["Tthvd", "-a", "a-", "a_b", "a.b", "", "x" * 64])
def test_names_must_be_dns_labels(name: str) -> None:
    with pytest.raises(InvalidRequest, match="DNS label"):
        check_name(name)


def test_good_names() -> None:
    assert check_name("tthvd") == "tthvd" and check_name("a-1") == "a-1"


def test_containers_message_explains_the_launcher() -> None:
    with pytest.raises(InvalidRequest, match="launcher"):
        check_containers(1)


def test_unknown_framework_lists_valid_ones() -> None:
    with pytest.raises(InvalidRequest, match="horovod, deepspeed, megatron, pytorch, slurm"):
        check_framework("tensorflow")


def test_mounts(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    assert parse_mount(f"{data}:/data", [tmp_path]).target == "/data"
    assert parse_mount(f"{data}://data/./x/", [tmp_path]).target == "/data/x"
    # valid specs this node refuses: 409 (create it), 403 (start the server with --allow-mount)
    with pytest.raises(Conflict, match="does not exist on the server"):
        parse_mount(f"{tmp_path}/missing:/data", [tmp_path])
    with pytest.raises(Forbidden, match="outside the allowed roots"):
        parse_mount("/etc:/data", [tmp_path])
    with pytest.raises(Forbidden, match="outside the allowed roots"):  # no probing outside the roots
        parse_mount("/nonexistent/x:/data", [tmp_path])
    for spec, message in [
        (f"{data}/../..:/data", r"'\.\.'"),
        ("data:/data", "absolute"),
        (f"{data}:relative", "absolute path"),
        ("nocolon", "SOURCE:TARGET"),
    ]:
        with pytest.raises(InvalidRequest, match=message):
            parse_mount(spec, [tmp_path])
    for target in ("/", "//etc", "/./etc/mpi/", "/var/log"):  # well-formed, but the platform's own
        with pytest.raises(Forbidden, match="reserved by the platform"):
            parse_mount(f"{data}:{target}", [tmp_path])
