"""`python -m elastrain` on bad input: a non-zero exit and one line on stderr that says what is wrong.

Every case runs in its own temporary directory. The processes are started together (some import torch
before they fail) and each test checks the result of one of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

TRAIN = "raise SystemExit(0)\n"

CASES: dict[str, tuple[list[str], dict[str, str]]] = {
    "min_above_max": (["run", "--min-np", "3", "--max-np", "2", "-H", "127.0.0.2:4", "python", "x.py"], {}),
    "min_above_max_script_exists": (
        ["run", "--min-np", "3", "--max-np", "2", "-H", "127.0.0.2:4", "python", "x.py"],
        {"x.py": TRAIN},
    ),
    "np_above_slots": (["run", "-np", "5", "-H", "127.0.0.2:2", "python", "train.py"], {"train.py": TRAIN}),
    "missing_script": (["run", "-np", "2", "python", "does_not_exist.py"], {}),
    "bad_hostfile": (
        ["run", "-np", "2", "--hostfile", "bad.txt", "python", "train.py"],
        {"train.py": TRAIN, "bad.txt": "127.0.0.2 slots=abc\n"},
    ),
    "missing_hostfile": (
        ["run", "-np", "2", "--hostfile", "missing.txt", "python", "train.py"],
        {"train.py": TRAIN},
    ),
    "no_command": (["run", "-np", "2"], {}),
    "unknown_command": (["launch"], {}),
    "discovery": (
        ["hosts", "--discovery", "hosts.txt"],
        {"hosts.txt": "# generation: 3\n127.0.0.2 slots=2\n\n# spare box\nnode-b\n[::1] slots=4\n"},
    ),
    "discovery_bad_hostfile": (["hosts", "--discovery", "hosts.txt"], {"hosts.txt": "ok slots=1\nslots=2\n"}),
    "unknown_option": (["run", "-np", "2", "--n", "5", "python", "train.py"], {"train.py": TRAIN}),
    "nnodes_not_a_number": (["run", "--nnodes", "two", "python", "train.py"], {"train.py": TRAIN}),
    "nnodes_and_np": (["run", "--nnodes", "1:2", "-np", "2", "python", "train.py"], {"train.py": TRAIN}),
    "nnodes_without_hosts": (["run", "--nnodes", "2", "python", "train.py"], {"train.py": TRAIN}),
    "rdzv_backend_etcd": (["run", "--rdzv-backend", "etcd", "python", "train.py"], {"train.py": TRAIN}),
    "rdzv_endpoint_bad_port": (["run", "--rdzv_endpoint", "127.0.0.1:http", "python", "train.py"], {}),
    "rdzv_endpoint_not_here": (
        ["run", "--rdzv-endpoint", "192.0.2.1:29400", "-np", "1", "python", "train.py"],
        {"train.py": TRAIN},
    ),
    "standalone_with_hosts": (["run", "--standalone", "-H", "127.0.0.2:1", "python", "train.py"], {}),
    "node_rank": (["run", "--node-rank", "1", "--nnodes", "2", "python", "train.py"], {"train.py": TRAIN}),
    "nproc_per_node_zero": (["run", "--nproc-per-node", "0", "python", "train.py"], {"train.py": TRAIN}),
    "wait_timeout_negative": (["cluster", "create", "c1", "--wait", "--timeout", "-1"], {}),
    "timeout_without_wait": (["cluster", "scale", "c1", "--containers", "3", "--timeout", "60"], {}),
    "output_xml": (["cluster", "get", "c1", "-o", "xml"], {}),
    "job_output_xml": (["job", "list", "-o", "xml"], {}),
}


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTRAIN_")}
    procs = {}
    for name, (argv, files) in CASES.items():
        cwd = tmp_path_factory.mktemp(name)
        for filename, text in files.items():
            (cwd / filename).write_text(text)
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "elastrain", *argv],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=60)
            out[name] = Result(proc.returncode, stdout, stderr)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def one_line_error(result: Result) -> str:
    """Check the shape every bad-input error has; return its one line."""
    assert result.returncode != 0, result
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert result.stdout == ""
    return lines[0]


def test_min_np_above_max_np(results: dict[str, Result]) -> None:
    line = one_line_error(results["min_above_max"])
    assert "--min-np 3" in line
    assert "--max-np 2" in line


def test_min_np_above_max_np_when_the_script_exists(results: dict[str, Result]) -> None:
    line = one_line_error(results["min_above_max_script_exists"])
    assert "--min-np 3" in line
    assert "--max-np 2" in line
    assert "larger" in line


def test_np_above_slots(results: dict[str, Result]) -> None:
    line = one_line_error(results["np_above_slots"])
    assert "-np 5" in line
    assert "2 slots" in line


def test_missing_script(results: dict[str, Result]) -> None:
    line = one_line_error(results["missing_script"])
    assert "does_not_exist.py" in line
    assert "does not exist" in line


def test_bad_hostfile_names_file_and_line(results: dict[str, Result]) -> None:
    line = one_line_error(results["bad_hostfile"])
    assert "bad.txt:1" in line
    assert "'abc'" in line
    assert "slots=" in line


def test_missing_hostfile(results: dict[str, Result]) -> None:
    line = one_line_error(results["missing_hostfile"])
    assert "missing.txt" in line
    assert "does not exist" in line


def test_no_training_command(results: dict[str, Result]) -> None:
    line = one_line_error(results["no_command"])
    assert "no training command" in line


def test_unknown_subcommand(results: dict[str, Result]) -> None:
    line = one_line_error(results["unknown_command"])
    assert "launch" in line


def test_hosts_discovery_prints_host_slots_lines(results: dict[str, Result]) -> None:
    result = results["discovery"]
    assert result.returncode == 0, result.stderr
    assert result.stdout == "127.0.0.2:2\nnode-b:1\n[::1]:4\n"
    assert result.stderr == ""


def test_hosts_discovery_bad_hostfile(results: dict[str, Result]) -> None:
    line = one_line_error(results["discovery_bad_hostfile"])
    assert "hosts.txt:2" in line
    assert "not a host" in line


def test_unknown_option_before_the_command(results: dict[str, Result]) -> None:
    line = one_line_error(results["unknown_option"])
    assert "unknown option --n" in line
    assert "before the training command" in line
    assert results["unknown_option"].returncode == 2


def test_nnodes_not_a_number(results: dict[str, Result]) -> None:
    line = one_line_error(results["nnodes_not_a_number"])
    assert "--nnodes must be N or MIN:MAX" in line
    assert "'two'" in line


def test_nnodes_and_np_together(results: dict[str, Result]) -> None:
    line = one_line_error(results["nnodes_and_np"])
    assert "--nnodes" in line
    assert "-np" in line


def test_nnodes_above_one_without_hosts(results: dict[str, Result]) -> None:
    line = one_line_error(results["nnodes_without_hosts"])
    assert "--nnodes 2 needs 2 hosts" in line
    assert "-H or --hostfile" in line


def test_rdzv_backend_refused_by_name(results: dict[str, Result]) -> None:
    line = one_line_error(results["rdzv_backend_etcd"])
    assert "--rdzv-backend etcd is not supported" in line
    assert "c10d" in line


def test_rdzv_endpoint_bad_port(results: dict[str, Result]) -> None:
    line = one_line_error(results["rdzv_endpoint_bad_port"])
    assert "'127.0.0.1:http'" in line
    assert "port" in line


def test_rdzv_endpoint_not_an_address_of_this_machine(results: dict[str, Result]) -> None:
    line = one_line_error(results["rdzv_endpoint_not_here"])
    assert "cannot listen on 192.0.2.1:29400" in line
    assert "address of this machine" in line


def test_standalone_with_hosts(results: dict[str, Result]) -> None:
    line = one_line_error(results["standalone_with_hosts"])
    assert "--standalone" in line
    assert "drop -H" in line


def test_node_rank_refused_with_a_hint(results: dict[str, Result]) -> None:
    line = one_line_error(results["node_rank"])
    assert "--node-rank is not used" in line
    assert "starts the agent of every host itself" in line


def test_nproc_per_node_zero(results: dict[str, Result]) -> None:
    line = one_line_error(results["nproc_per_node_zero"])
    assert "--nproc-per-node must be at least 1, got 0" in line


@pytest.mark.parametrize(
    ("case", "flag_text"),
    [
        (
            "wait_timeout_negative",
            "argument --timeout: must be a positive number of seconds, e.g. 300, got '-1'",
        ),
        ("output_xml", "argument -o/--output: invalid choice: 'xml' (choose from 'table', 'json', 'yaml')"),
        ("job_output_xml", "argument -o/--output: invalid choice: 'xml'"),
    ],
)
def test_bad_timeout_and_output_flags_are_argparse_errors(
    results: dict[str, Result], case: str, flag_text: str
) -> None:
    line = one_line_error(results[case])
    assert results[case].returncode == 2
    assert line.startswith("elastrain ") and flag_text in line and line.endswith("(see --help)")


def test_a_timeout_with_nothing_to_bound_is_refused(results: dict[str, Result]) -> None:
    line = one_line_error(results["timeout_without_wait"])
    assert results["timeout_without_wait"].returncode == 2
    assert line == "elastrain cluster: error: --timeout bounds --wait: add --wait (or drop --timeout)"
