"""`elastrain run`'s argv: where its options end, torchrun's spellings, and the mode auto-detection."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from elastrain.cli.main import build_parser
from elastrain.cli.run_argv import parse_run_args, size_from_nnodes, torchrun_flags, training_command
from elastrain.errors import ConfigError
from elastrain.hostfile import parse_host_list
from elastrain.launcher.hosts import StaticHosts, WatchedHostfile
from elastrain.launcher.mode import python_target, uses_elastrain

REPO = Path(__file__).resolve().parents[2]


def parse(*argv: str) -> argparse.Namespace:
    return parse_run_args(build_parser(), list(argv))


@pytest.mark.parametrize(
    ("argv", "np", "hosts", "command"),
    [
        (
            ["-np", "2", "-H", "127.0.0.2:2", "python", "t.py", "--n", "5"],
            2,
            "127.0.0.2:2",
            ["python", "t.py", "--n", "5"],
        ),
        (
            ["--num-proc=2", "-H", "a:1,b:1", "python", "t.py", "-np", "3", "-v"],
            2,
            "a:1,b:1",
            ["python", "t.py", "-np", "3", "-v"],
        ),
        (
            ["-Ha:1", "python", "-m", "mod", "-v", "--np", "3"],
            None,
            "a:1",
            ["python", "-m", "mod", "-v", "--np", "3"],
        ),
        (["-np", "1", "--", "-weird", "--hostfile", "x"], 1, None, ["-weird", "--hostfile", "x"]),
        (["-np", "1", "python", "t.py", "--", "--x"], 1, None, ["python", "t.py", "--", "--x"]),
        (["python", "t.py", "-h"], None, None, ["python", "t.py", "-h"]),
    ],
)
def test_options_end_where_the_command_begins(
    argv: list[str], np: int | None, hosts: str | None, command: list[str]
) -> None:
    args = parse(*argv)
    assert (args.np, args.host_list, args.command) == (np, hosts, command)


def test_a_value_that_looks_like_an_option_is_still_the_value() -> None:
    assert parse("-np", "-1", "python", "t.py").np == -1  # refused later by the size checks, by name
    assert parse("--mode", "restart", "-v", "python", "t.py").verbose


@pytest.mark.parametrize("token", ["--n", "--num", "--bogus", "-x", "--hostfil"])
def test_unknown_or_abbreviated_option_before_the_command_is_refused(
    token: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse("-np", "2", token, "python", "t.py")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert f"unknown option {token}" in err


def torchrun(*argv: str) -> argparse.Namespace:
    args = parse(*argv)
    torchrun_flags(args)
    return args


def test_standalone_is_this_machine_with_nproc_per_node_slots() -> None:
    args = torchrun("--standalone", "--nproc-per-node", "2", "train.py", "--lr", "1")
    assert args.host_list == "127.0.0.1:2"
    assert args.coordinator_host == "127.0.0.1"
    assert training_command(args) == ["python", "train.py", "--lr", "1"]


def test_module_and_no_python_forms() -> None:
    assert training_command(torchrun("-m", "pkg.train", "--x")) == ["python", "-m", "pkg.train", "--x"]
    assert training_command(torchrun("--no-python", "t.py")) == ["t.py"]
    assert training_command(torchrun("python", "t.py")) == ["python", "t.py"]


@pytest.mark.parametrize(
    ("endpoint", "host", "port"),
    [("10.1.2.3:1234", "10.1.2.3", 1234), ("node-a", "node-a", 29400), ("[::1]:5000", "::1", 5000)],
)
def test_rdzv_endpoint_is_the_coordinator_address(endpoint: str, host: str, port: int) -> None:
    args = torchrun(
        "--rdzv_endpoint", endpoint, "--rdzv-backend", "c10d", "--rdzv-id", "j1", "python", "t.py"
    )
    assert (args.coordinator_host, args.coordinator_port) == (host, port)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nnodes", "x"], "--nnodes must be N or MIN:MAX"),
        (["--nnodes", "4:2"], "MIN 4 is larger than MAX 2"),
        (["--nnodes", "2", "-np", "2"], "give the job's size once"),
        (["--rdzv-backend", "etcd"], "--rdzv-backend etcd is not supported"),
        (["--rdzv-endpoint", "h:0"], "the port must be a number"),
        (["--rdzv-endpoint", "h:1", "--coordinator-port", "5"], "give the coordinator's address once"),
        (["--standalone", "--hostfile", "h"], "drop --hostfile"),
        (["--standalone", "--nnodes", "1:2"], "--standalone is one node"),
        (["--node-rank", "0"], "--node-rank is not used"),
        (["--master_port", "29500"], "--master-port is not used"),
        (["--nproc-per-node", "0"], "--nproc-per-node must be at least 1"),
        (["--nproc_per_node", "two"], "--nproc-per-node must be a number"),
    ],
)
def test_bad_torchrun_flags_name_the_problem(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        torchrun(*argv, "python", "t.py")


def sized(
    argv: list[str], source: StaticHosts | WatchedHostfile
) -> tuple[int | None, int | None, int | None]:
    args = torchrun(*argv, "python", "t.py")
    size_from_nnodes(args, source)
    return args.np, args.min_np, args.max_np


def test_nnodes_counts_hosts_times_workers_per_host(tmp_path: Path) -> None:
    two = StaticHosts(parse_host_list("a:2,b:2"))
    assert sized(["--nnodes", "2", "-H", "a:2,b:2"], two) == (4, None, None)
    assert sized(["--nnodes", "1:2", "-H", "a:2,b:2"], two) == (None, 2, 4)
    assert sized(["--nnodes", "1:2", "--nproc-per-node", "1", "-H", "a,b"], two) == (None, 1, 2)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("a slots=1\n")
    grows = WatchedHostfile(hostfile)  # a hostfile may grow: --nnodes MIN above it waits for hosts
    assert sized(["--nnodes", "2:4", "--hostfile", str(hostfile)], grows) == (None, 2, 4)
    with pytest.raises(ConfigError, match="-H lists 2"):
        sized(["--nnodes", "3", "-H", "a:2,b:2"], two)
    with pytest.raises(ConfigError, match="different slot counts"):
        sized(["--nnodes", "2", "-H", "a:1,b:2"], StaticHosts(parse_host_list("a:1,b:2")))
    with pytest.raises(ConfigError, match="only this machine"):
        sized(["--nnodes", "2"], StaticHosts(parse_host_list("127.0.0.1:1")))


@pytest.mark.parametrize(
    ("command", "target"),
    [
        (["python", "-c", "print(1)"], ("code", "print(1)")),
        (["python3", "-u", "-W", "ignore", "t.py", "-c", "x"], ("script", "t.py")),
        (["python", "-um", "pkg.mod", "-v"], ("module", "pkg.mod")),
        (["python", "-Wignore", "-X", "dev", "--", "t.py"], ("script", "t.py")),
        (["python", "-"], None),
        (["python"], None),
    ],
)
def test_python_target(command: list[str], target: tuple[str, str] | None) -> None:
    assert python_target(command) == target


def test_mode_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "native.py").write_text("import torch\n\ndef main():\n    import elastrain\n")
    (tmp_path / "plain.py").write_text("# this script does not import elastrain\nimport torch\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("from elastrain.runtime import loop\n")
    assert uses_elastrain(["python", "native.py"])
    (tmp_path / "hvd.py").write_text("import torch\nimport horovod.torch as hvd\n")
    assert uses_elastrain(["python", "hvd.py"])  # Horovod's API is elastrain's in its images
    (tmp_path / "ds.py").write_text("from elastrain.frameworks.deepspeed_elastic import x\n")
    assert not uses_elastrain(["python", "ds.py"])  # helpers for restart-mode scripts
    assert not uses_elastrain(["python", "-c", "import elastrain.frameworks.megatron_cpu"])
    for name in ("megatron_gpt.py", "torchrun_ddp.py"):
        assert not uses_elastrain(["python", str(REPO / "examples" / name)]), name
    # deepspeed_train.py imports elastrain.deepspeed for its in-place path: native unless --mode restart
    for name in ("mnist_elastic.py", "horovod_mnist_elastic.py", "deepspeed_train.py"):
        assert uses_elastrain(["python", str(REPO / "examples" / name)]), name
    assert not uses_elastrain(["python", "plain.py", "native.py"])
    assert not uses_elastrain(["python", "-c", "print('hi')"])
    assert uses_elastrain(["python", "-c", "import os, elastrain"])
    assert uses_elastrain(["python", "-m", "pkg.train"])
    assert not uses_elastrain(["python", "-m", "json.tool"])
    assert not uses_elastrain(["echo", "hi"])  # a binary
    (tmp_path / "wrapper.sh").write_text("#!/bin/sh\nexec python train.py\n")
    (tmp_path / "wrapper.sh").chmod(0o755)
    assert uses_elastrain([str(tmp_path / "wrapper.sh")])  # a wrapper: cannot tell, native as before
    assert not uses_elastrain(["deepspeed", "plain.py"])
    assert uses_elastrain(["python", "-m", "no_such_module_here"])  # cannot tell: native, as before
