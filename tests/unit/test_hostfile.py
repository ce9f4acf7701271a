"""The hostfile format: parse/render round trip, comments, generations, -H lists, atomic writes, errors."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastrain.errors import ConfigError, HostfileError
from elastrain.hostfile import (
    Host,
    Hostfile,
    parse_host_list,
    parse_hostfile,
    read_hostfile,
    render_discovery,
    render_hostfile,
    write_hostfile,
)

HOST_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:[]-"
host_names = st.text(alphabet=HOST_CHARS, min_size=1, max_size=24)
hostfiles = st.builds(
    lambda names, slots, generation: Hostfile(
        tuple(Host(n, s) for n, s in zip(names, slots)),
        generation,
    ),
    st.lists(host_names, unique=True, max_size=12),
    st.lists(st.integers(min_value=1, max_value=10_000), min_size=12, max_size=12),
    st.integers(min_value=0, max_value=2**40),
)


# ----- round trip ----------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(hostfiles)
def test_render_then_parse_is_identity(hostfile: Hostfile) -> None:
    parsed = parse_hostfile(render_hostfile(hostfile))
    assert parsed == hostfile
    assert parsed.hosts == hostfile.hosts  # same order, same slots
    assert parsed.generation == hostfile.generation
    assert parsed.total_slots == sum(h.slots for h in hostfile.hosts)


@settings(max_examples=100, deadline=None)
@given(hostfiles)
def test_write_then_read_is_identity(tmp_path_factory: pytest.TempPathFactory, hostfile: Hostfile) -> None:
    path = tmp_path_factory.mktemp("hf") / "hosts"
    written = write_hostfile(path, hostfile.hosts, hostfile.generation)
    assert written == hostfile
    assert read_hostfile(path) == hostfile


def test_render_format() -> None:
    hostfile = Hostfile((Host("127.0.0.2", 2), Host("node-b", 4)), generation=7)
    assert render_hostfile(hostfile) == "# generation: 7\n127.0.0.2 slots=2\nnode-b slots=4\n"


# ----- what readers accept -------------------------------------------------------------------------


def test_blank_lines_comments_and_generation() -> None:
    text = (
        "\n"
        "# written by hand\n"
        "   \n"
        "#generation:   12  \n"
        "127.0.0.2 slots=2   # the first box\n"
        "\t\n"
        "node-b\n"  # slots default to 1
        "  [::1]   slots=3  \n"
        "# trailing comment\n"
    )
    hostfile = parse_hostfile(text, "hosts.txt")
    assert hostfile.generation == 12
    assert hostfile.hosts == (Host("127.0.0.2", 2), Host("node-b", 1), Host("[::1]", 3))
    assert hostfile.total_slots == 6
    assert hostfile.slots_by_host() == {"127.0.0.2": 2, "node-b": 1, "[::1]": 3}
    assert list(hostfile.slots_by_host()) == ["127.0.0.2", "node-b", "[::1]"]
    assert "# written by hand" in hostfile.comments


def test_generation_defaults_to_zero_and_last_one_wins() -> None:
    assert parse_hostfile("a slots=1\n").generation == 0
    assert parse_hostfile("# generation: 1\na\n# generation: 4\n").generation == 4


def test_comments_do_not_affect_equality() -> None:
    a = parse_hostfile("# one comment\na slots=2\n")
    b = parse_hostfile("a slots=2\n# another\n")
    assert a == b


def test_max_slots_is_accepted_and_does_not_change_slots() -> None:
    hostfile = parse_hostfile("a slots=2 max_slots=8\nb max-slots=4\n")
    assert hostfile.hosts == (Host("a", 2), Host("b", 1))


def test_empty_text_is_an_empty_hostfile() -> None:
    hostfile = parse_hostfile("\n# nothing here\n\n")
    assert hostfile.hosts == ()
    assert hostfile.total_slots == 0


def test_crlf_line_endings() -> None:
    hostfile = parse_hostfile("# generation: 2\r\na slots=2\r\nb slots=1\r\n")
    assert hostfile == Hostfile((Host("a", 2), Host("b", 1)), 2)


# ----- errors name the file, the line and the fix --------------------------------------------------


BAD_LINES = [
    ("host slots=abc", r"not a number", "slots=1"),
    ("slots=2", r"not a host", "HOST slots=N"),
    ("host slots=-1", r"at least 1", "remove the line"),
    ("host slots=0", r"at least 1", "remove the line"),
    ("host slots=", r"not a number", "slots=1"),
    ("host gpus=2", r"unknown option", "HOST slots=N"),
    ("host 2", r"unknown option", "HOST slots=N"),
    ("host :2", r"unexpected", "HOST slots=N"),
    ("bad/name slots=1", r"not a valid host name", ""),
]


@pytest.mark.parametrize(("line", "what", "fix"), BAD_LINES, ids=[b[0] for b in BAD_LINES])
def test_bad_line_names_file_line_and_fix(line: str, what: str, fix: str) -> None:
    text = f"# generation: 1\n\ngood slots=1\n{line}\nother slots=1\n"
    with pytest.raises(HostfileError) as info:
        parse_hostfile(text, "hosts.txt")
    message = str(info.value)
    assert "hosts.txt:4" in message
    assert re.search(what, message)
    assert fix in message


def test_duplicate_host_is_refused() -> None:
    with pytest.raises(HostfileError) as info:
        parse_hostfile("a slots=1\nb slots=2\na slots=3\n", "hosts.txt")
    message = str(info.value)
    assert "hosts.txt:3" in message
    assert "'a'" in message
    assert "listed twice" in message
    assert "one line per host" in message


def test_hostfile_error_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_hostfile("x slots=abc\n")


def test_read_hostfile_error_names_the_path_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("ok slots=1\n127.0.0.2 slots=abc\n")
    with pytest.raises(HostfileError) as info:
        read_hostfile(path)
    assert f"{path}:2" in str(info.value)
    assert "'abc'" in str(info.value)


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "hosts.txt"
    with pytest.raises(HostfileError) as info:
        read_hostfile(path)
    assert str(path) in str(info.value)
    assert "does not exist" in str(info.value)


def test_unreadable_path_is_a_hostfile_error(tmp_path: Path) -> None:
    with pytest.raises(HostfileError) as info:
        read_hostfile(tmp_path)  # a directory
    assert str(tmp_path) in str(info.value)


# ----- horovod -H lists ----------------------------------------------------------------------------


def test_parse_host_list() -> None:
    hostfile = parse_host_list("127.0.0.2:2, node-b ,node-c:4,")
    assert hostfile.hosts == (Host("127.0.0.2", 2), Host("node-b", 1), Host("node-c", 4))
    assert hostfile.total_slots == 7
    assert hostfile.generation == 0


def test_parse_host_list_ipv6() -> None:
    assert parse_host_list("::1").hosts == (Host("::1", 1),)
    assert parse_host_list("[::1]:2,[fe80::1]").hosts == (Host("[::1]", 2), Host("[fe80::1]", 1))
    with pytest.raises(HostfileError, match="not a number"):
        parse_host_list("[::1]:x")


host_list_names = st.one_of(
    st.text(alphabet=HOST_CHARS.replace(":", ""), min_size=1, max_size=16),
    st.text(alphabet="0123456789abcdef:", min_size=1, max_size=16).map(lambda v6: f"[{v6}]"),
)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(host_list_names, unique=True, min_size=1),
    st.lists(st.integers(min_value=1, max_value=512), min_size=1),
)
def test_host_list_round_trips_through_discovery_format(names: list[str], slots: list[int]) -> None:
    hosts = tuple(Host(n, slots[i % len(slots)]) for i, n in enumerate(names))
    spec = ",".join(f"{h.name}:{h.slots}" for h in hosts)
    parsed = parse_host_list(spec)
    assert parsed.hosts == hosts
    assert parse_host_list(render_discovery(parsed).replace("\n", ",")).hosts == hosts


@pytest.mark.parametrize(
    ("spec", "what"),
    [
        ("a:2,a:1", "listed twice"),
        ("a:0", "at least 1"),
        ("a:x", "not a number"),
        (":2", "not HOST or HOST:SLOTS"),
        ("a b:1", "not HOST or HOST:SLOTS"),
        ("", "no hosts given"),
        (" , ", "no hosts given"),
    ],
)
def test_bad_host_list(spec: str, what: str) -> None:
    with pytest.raises(HostfileError) as info:
        parse_host_list(spec)
    assert "-H" in str(info.value)
    assert what in str(info.value)


# ----- discovery output ----------------------------------------------------------------------------


def test_render_discovery() -> None:
    hostfile = Hostfile((Host("127.0.0.2", 2), Host("node-b", 1)), generation=5)
    assert render_discovery(hostfile) == "127.0.0.2:2\nnode-b:1\n"
    assert render_discovery(Hostfile()) == ""


# ----- atomic writes -------------------------------------------------------------------------------


def test_write_hostfile_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "hosts"  # the directory is created
    for generation in range(5):
        hosts = [Host(f"h{i}", i + 1) for i in range(generation + 1)]
        written = write_hostfile(path, hosts, generation)
        assert written == Hostfile(tuple(hosts), generation)
        assert path.read_text() == render_hostfile(written)
        assert read_hostfile(path) == written
        assert sorted(p.name for p in path.parent.iterdir()) == ["hosts"]
    assert path.stat().st_mode & 0o777 == 0o644


def test_write_hostfile_replaces_content_completely(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    write_hostfile(path, [Host(f"host-{i}", 8) for i in range(100)], 1)
    write_hostfile(path, [Host("only", 1)], 2)
    assert path.read_text() == "# generation: 2\nonly slots=1\n"


def test_failed_write_keeps_the_old_file_and_no_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "hosts"
    write_hostfile(path, [Host("a", 1)], 1)
    before = path.read_text()

    def broken_replace(src: str, dst: str) -> None:
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_hostfile(path, [Host("b", 2)], 2)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["hosts"]
