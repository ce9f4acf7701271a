"""`elastrain job`: detached commands in a launcher container (submit, list, get, logs, events, cancel)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from elastrain.cli.output import OutputFormat, add_output_flag, print_data
from elastrain.cli.table import format_table
from elastrain.errors import ConfigError
from elastrain.server.event_text import event_text

_TERMINAL = ("Succeeded", "Failed", "Cancelled")


def add_job_parser(sub: argparse._SubParsersAction, conn: argparse.ArgumentParser) -> None:
    """Register `elastrain job`."""
    job = sub.add_parser("job", help="run detached jobs in a cluster and follow them")
    jsub = job.add_subparsers(dest="action", required=True, parser_class=type(job))
    p = jsub.add_parser("submit", parents=[conn], help="run a command detached in the launcher container")
    p.add_argument("cluster")
    p.add_argument("-f", "--follow", action="store_true", help="stream the log until the job ends")
    p.add_argument(
        "--tensorboard-dir",
        metavar="DIR",
        help="write TensorBoard scalars under DIR in the launcher container (an absolute path)",
    )
    p.add_argument(
        "--retries",
        type=int,
        metavar="N",
        help="start the command again up to N times after it exits non-zero (default 0)",
    )
    p.add_argument(
        "--max-platform-restarts",
        type=int,
        metavar="N",
        help="start the job again up to N times after its launcher container died under it (default 3)",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p = jsub.add_parser("list", parents=[conn], help="list your jobs")
    p.add_argument("--cluster", help="only this cluster's jobs")
    add_output_flag(p)
    p = jsub.add_parser("get", parents=[conn], help="show a job's status and progress")
    p.add_argument("job_id", type=int)
    add_output_flag(p)
    p = jsub.add_parser("logs", parents=[conn], help="print a job's output")
    p.add_argument("job_id", type=int)
    p.add_argument("-f", "--follow", action="store_true", help="keep streaming until the job ends")
    p = jsub.add_parser("events", parents=[conn], help="a job's events: incidents (generation changes) too")
    p.add_argument("job_id", type=int)
    add_output_flag(p)
    p = jsub.add_parser("cancel", parents=[conn], help="stop a running job")
    p.add_argument("job_id", type=int)


def _progress(job: dict[str, Any]) -> str:
    parts = [
        f"{k}={job[k]}"
        for k in ("epoch", "step", "loss", "samples_per_s", "world_size")
        if job.get(k) is not None
    ]
    return " ".join(parts) or "-"


def _print_events(events: list[dict[str, Any]], output: str) -> int:
    if output != OutputFormat.TABLE.value:
        print_data(events, output)
        return 0
    for event in events:
        print(f"{event['at'][:19]}  {event_text(event)}")
    if not events:
        print("no events")
    return 0


def _follow(client: Any, job_id: int) -> int:
    for text in client.follow_job_logs(job_id):
        sys.stdout.write(text)
        sys.stdout.flush()
    job = client.get_job(job_id)
    code = job.get("exit_code")
    return int(code) if code is not None else (0 if job["status"] == "Succeeded" else 1)


def run_job_command(args: argparse.Namespace) -> int:
    """Dispatch one `elastrain job` action."""
    from elastrain.client import Client

    with Client(args.url, args.token) as client:
        if args.action == "submit":
            command = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not command:
                raise ConfigError("no command given; e.g. elastrain job submit tthvd -- python train.py")
            for flag, value in (
                ("--retries", args.retries),
                ("--max-platform-restarts", args.max_platform_restarts),
            ):
                if value is not None and not 0 <= value <= 100:
                    raise ConfigError(f"{flag} must be 0..100, got {value}")
            extra: dict[str, Any] = {"tensorboard_dir": args.tensorboard_dir} if args.tensorboard_dir else {}
            if args.retries is not None:
                extra["retries"] = args.retries
            if args.max_platform_restarts is not None:
                extra["max_platform_restarts"] = args.max_platform_restarts
            job = client.submit_job(args.cluster, command, **extra)
            print(f"job {job['id']} submitted to {job['cluster']}", file=sys.stderr)
            print(job["id"])
            return _follow(client, job["id"]) if args.follow else 0
        if args.action == "logs":
            if args.follow:
                return _follow(client, args.job_id)
            text, _offset, _status = client.job_logs(args.job_id)
            sys.stdout.write(text)
            return 0
        if args.action == "events":
            return _print_events(client.job_events(args.job_id), args.output)
        if args.action == "cancel":
            job = client.cancel_job(args.job_id)
            print(f"job {job['id']}: {job['status']}")
            return 0
        jobs = [client.get_job(args.job_id)] if args.action == "get" else client.list_jobs(args.cluster)
        if args.output != OutputFormat.TABLE.value:
            print_data(jobs[0] if args.action == "get" else jobs, args.output)
            return 0
        rows = [["ID", "CLUSTER", "STATUS", "EXIT", "PROGRESS", "COMMAND"]]
        for job in jobs:
            exit_code = "-" if job["exit_code"] is None else str(job["exit_code"])
            rows.append(
                [
                    str(job["id"]),
                    job["cluster"],
                    job["status"],
                    exit_code,
                    _progress(job),
                    " ".join(job["command"])[:60],
                ]
            )
        print(format_table(rows))
        if not jobs:
            print("no jobs")
        return 0
