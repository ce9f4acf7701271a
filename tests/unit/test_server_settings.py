"""`elastrain server` settings: flag > environment > settings file > default; secrets never in argv."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastrain.cli.cluster import TOKEN_IN_ARGV_WARNING
from elastrain.cli.main import build_parser
from elastrain.errors import ConfigError
from elastrain.server.settings import (
    DB_ENV,
    NAMES,
    db_url_has_password,
    host_commands_allowed,
    load_settings,
    scrub_secrets_from_environment,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No server setting leaks in from the developer's environment."""
    for _flag, env in NAMES.values():
        monkeypatch.delenv(env, raising=False)
    monkeypatch.delenv("ELASTRAIN_CONFIG", raising=False)


def server_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["server", *argv])


def settings_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "server.env"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_defaults_without_flags_env_or_file() -> None:
    s = load_settings(server_args())
    assert (s.host, s.port, s.db, s.gpus, s.backend, s.allow_mount) == (
        "127.0.0.1",
        8080,
        None,
        None,
        None,
        [],
    )
    assert (s.drain_seconds, s.reconcile_interval, s.scheduler) == (30.0, 0.5, "elastic")
    assert s.idle_release_after == 600
    half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    assert s.container_memory == "auto" and s.container_memory_bytes() == half
    assert load_settings(server_args("--container-memory", "4Gi")).container_memory_bytes() == 4 * 2**30
    assert load_settings(server_args("--container-memory", "0")).container_memory_bytes() == 0
    assert s.insecure_host_commands is False and s.data_dir == Path("~/.elastrain").expanduser()


def test_flag_beats_env_beats_file_beats_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = settings_file(
        tmp_path,
        "# comment\nELASTRAIN_SERVER_PORT=7001\nELASTRAIN_GPUS=3\nELASTRAIN_DRAIN_SECONDS=5\n"
        "ELASTRAIN_DB='postgresql://app:s3cret@db/elastrain'\n",
    )
    monkeypatch.setenv("ELASTRAIN_GPUS", "4")
    monkeypatch.setenv("ELASTRAIN_SERVER_PORT", "7002")
    s = load_settings(server_args("--config", str(config), "--port", "7003"))
    assert s.port == 7003  # flag over env and file
    assert s.gpus == 4  # env over file
    assert s.drain_seconds == 5.0  # file over default
    assert s.db == "postgresql://app:s3cret@db/elastrain"  # a password may live in a 0600 file
    assert s.reconcile_interval == 0.5  # default
    monkeypatch.setenv("ELASTRAIN_CONFIG", str(config))  # the file named by the environment
    assert load_settings(server_args()).port == 7002


def test_env_names_and_lists(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ELASTRAIN_ALLOW_MOUNT", f"{tmp_path}:{tmp_path / 'b'}")
    monkeypatch.setenv("ELASTRAIN_INSECURE_HOST_COMMANDS", "1")
    monkeypatch.setenv("ELASTRAIN_SERVER_BACKEND", "process")
    monkeypatch.setenv("ELASTRAIN_SCHEDULER", "static")  # the default is elastic
    monkeypatch.setenv("ELASTRAIN_IDLE_RELEASE_AFTER", "90")
    monkeypatch.setenv("ELASTRAIN_BACKEND", "gloo")  # a worker's variable: not the server's backend
    monkeypatch.setenv("ELASTRAIN_HOST", "10.0.0.9")  # likewise a worker's
    s = load_settings(server_args())
    assert s.allow_mount == [tmp_path, tmp_path / "b"]
    assert (s.backend, s.insecure_host_commands, s.scheduler, s.host) == (
        "process",
        True,
        "static",
        "127.0.0.1",
    )
    assert s.idle_release_after == 90
    s = load_settings(server_args("--allow-mount", "/x", "--backend", "container"))
    assert s.allow_mount == [Path("/x")] and s.backend == "container"


def test_settings_are_one_object() -> None:
    s = load_settings(server_args("--port", "9001", "--insecure-host-commands"))
    assert (s.port, s.insecure_host_commands, s.host, s.scheduler) == (
        9001,
        True,
        "127.0.0.1",
        "elastic",
    )


def test_the_old_insecure_names_still_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--insecure-process-backend / ELASTRAIN_INSECURE_PROCESS_BACKEND are aliases of
    --insecure-host-commands (flag, environment and settings file)."""
    assert load_settings(server_args("--insecure-process-backend")).insecure_host_commands is True
    monkeypatch.setenv("ELASTRAIN_INSECURE_PROCESS_BACKEND", "yes")
    assert load_settings(server_args()).insecure_host_commands is True
    monkeypatch.delenv("ELASTRAIN_INSECURE_PROCESS_BACKEND")
    config = settings_file(tmp_path, "ELASTRAIN_INSECURE_PROCESS_BACKEND=1\n")
    assert load_settings(server_args("--config", str(config))).insecure_host_commands is True
    assert load_settings(server_args()).insecure_host_commands is False


@pytest.mark.parametrize(
    "env, value, needle",
    [
        ("ELASTRAIN_SERVER_PORT", "http", "--port / ELASTRAIN_SERVER_PORT"),
        ("ELASTRAIN_SERVER_BACKEND", "docker", "--backend / ELASTRAIN_SERVER_BACKEND"),
        ("ELASTRAIN_INSECURE_HOST_COMMANDS", "maybe", "--insecure-host-commands"),
        ("ELASTRAIN_INSECURE_PROCESS_BACKEND", "maybe", "--insecure-process-backend"),
        ("ELASTRAIN_CONTAINER_MEMORY", "lots", "--container-memory"),
    ],
)
def test_bad_values_are_one_line_errors(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as err:
        load_settings(server_args())
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_settings_file_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(server_args("--config", str(tmp_path / "missing.env")))
    typo = settings_file(tmp_path, "ELASTRAIN_PROT=1\n")
    with pytest.raises(ConfigError, match="unknown name 'ELASTRAIN_PROT'"):
        load_settings(server_args("--config", str(typo)))
    readable = settings_file(tmp_path, "ELASTRAIN_DB=postgresql://u:pw@h/d\n", mode=0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_settings(server_args("--config", str(readable)))
    no_secret = settings_file(tmp_path, "ELASTRAIN_DB=postgresql://u@h/d\n", mode=0o644)
    assert load_settings(server_args("--config", str(no_secret))).db == "postgresql://u@h/d"


def test_db_password_in_argv_is_refused() -> None:
    for url in ("postgresql://u:pw@h/d", "postgresql://u@h/d?password=pw"):
        assert db_url_has_password(url)
        with pytest.raises(ConfigError, match="ELASTRAIN_DB") as err:
            load_settings(server_args("--db", url))
        assert "pw" not in str(err.value)
    for url in ("postgresql://u@h/d", "sqlite:////tmp/x.db", "postgresql://u:@h/d"):
        assert not db_url_has_password(url)


def test_cli_db_password_is_one_line_without_traceback(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "elastrain", "server", "--data-dir", str(tmp_path / "d")]
    argv += ["--db", "postgresql://app:hunter2@127.0.0.1:1/x"]
    env = {k: v for k, v in os.environ.items() if k not in (DB_ENV, "ELASTRAIN_CONFIG")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ELASTRAIN_DB" in lines[0] and "hunter2" not in lines[0]
    assert not (tmp_path / "d").exists()  # refused before touching anything


def test_scrub_drops_the_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DB_ENV, "postgresql://u:pw@h/d")
    scrub_secrets_from_environment()
    assert DB_ENV not in os.environ


def test_host_commands_policy() -> None:
    """Tenants' commands run where they are isolated (containers); on the process and Slurm backends
    they would run on this machine as the server's user, so only with --insecure-host-commands."""
    assert host_commands_allowed("container", False) and host_commands_allowed("container", True)
    for backend in ("process", "local", "slurm"):
        assert not host_commands_allowed(backend, False), backend
        assert host_commands_allowed(backend, True), backend


def test_help_names_every_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["server", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for _flag, env in NAMES.values():
        assert env in text, env
    assert "--config FILE" in text and "--insecure-host-commands" in text
    assert "--insecure-process-backend" in text  # the old name, still accepted


def test_token_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    args = parser.parse_args(["cluster", "list", "--token", "t0k"])
    assert args.token == "t0k" and TOKEN_IN_ARGV_WARNING in capsys.readouterr().err
    token_file = tmp_path / "token"
    token_file.write_text("fil3-t0ken\n")
    args = parser.parse_args(["job", "list", "--token-file", str(token_file)])
    assert args.token == "fil3-t0ken" and capsys.readouterr().err == ""
    assert parser.parse_args(["cluster", "list"]).token is None  # then $ELASTRAIN_TOKEN (the client)
    for bad in (["--token-file", str(tmp_path / "none")], ["--token-file", str(token_file), "--token", "x"]):
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args(["cluster", "list", *bad])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") <= 1 and "error" in err


def test_quota_defaults_come_from_flags_env_and_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(server_args())
    assert (s.quota_clusters, s.quota_containers, s.quota_gpus) == (20, 64, None)
    monkeypatch.setenv("ELASTRAIN_QUOTA_GPUS", "16")
    config = settings_file(tmp_path, "ELASTRAIN_QUOTA_CONTAINERS=10\n")
    s = load_settings(server_args("--config", str(config), "--quota-clusters", "3"))
    assert (s.quota_clusters, s.quota_containers, s.quota_gpus) == (3, 10, 16)


def test_a_negative_quota_is_one_line_error() -> None:
    with pytest.raises(ConfigError, match="--quota-clusters"):
        load_settings(server_args("--quota-clusters", "-1"))


def test_gpus_is_a_count_or_a_spec_of_named_models(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(server_args("--gpus", "4")).gpus == 4
    assert load_settings(server_args("--gpus", "A100:2,V100:2")).gpus == "A100:2,V100:2"
    monkeypatch.setenv("ELASTRAIN_GPUS", "H100:8")
    assert load_settings(server_args()).gpus == "H100:8"
