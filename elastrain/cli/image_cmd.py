"""`elastrain image build | list`: build the offline OCI images jobs run in, and list them."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from elastrain.cli.output import OutputFormat, add_output_flag, print_data
from elastrain.cli.progress import StatusLine, Ticker, TimedOut, raise_after, timeout_seconds
from elastrain.cli.table import format_table
from elastrain.errors import ConfigError


def add_image_parser(sub: argparse._SubParsersAction) -> None:
    """Register `elastrain image` with its `build` and `list` subcommands."""
    p = sub.add_parser("image", help="build and list the OCI images jobs run in (podman, offline)")
    isub = p.add_subparsers(dest="image_cmd", metavar="{build,list}", required=True, parser_class=type(p))
    b = isub.add_parser(
        "build", help="build the image of a framework (Debian bookworm + venv + elastrain; cached)"
    )
    b.add_argument("--framework", default="pytorch", help="the framework the image holds (default pytorch)")
    b.add_argument("--json", type=Path, metavar="PATH", help="write the build result as JSON here")
    b.add_argument(
        "--timeout",
        type=timeout_seconds,
        metavar="SECONDS",
        help="stop the build after SECONDS (exit 1; finished layers stay cached for the next build)",
    )
    ls = isub.add_parser("list", help="the elastrain images podman holds")
    add_output_flag(ls)


def human_size(n: int) -> str:
    """Bytes in podman's style: decimal units, three significant digits (``1.4 GB``)."""
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000:
            return f"{size:.3g} {unit}"
        size /= 1000
    return f"{size:.3g} TB"


class BuildStatus:
    """`build_image`'s progress for the CLI: each finished step a line on stdout, the running step on
    the live status line (stderr)."""

    def __init__(self, framework: str, status: StatusLine) -> None:
        self.framework, self.status = framework, status
        self.stage = "preparing (source hashes, the build lock)"
        self.status.update(f"image {framework}: {self.stage}")

    def __call__(self, line: str) -> None:
        self.status.message(line)

    def stage_started(self, what: str) -> None:
        """A build step begins: it becomes the status line."""
        self.stage = what
        self.status.update(f"image {self.framework}: {what}")


def _build(args: argparse.Namespace) -> int:
    from elastrain.images.build import build_image
    from elastrain.images.recipe import cache_dir, recipe_for

    print(f"image: building {recipe_for(args.framework).repo} ({args.framework})", flush=True)
    status = StatusLine()
    progress = BuildStatus(args.framework, status)
    logs = cache_dir() / "logs"

    def timed_out() -> TimedOut:
        return TimedOut(
            f"image build timed out after {args.timeout:g}s in step '{progress.stage}' "
            f"(stopped; the finished layers stay cached): run `elastrain image build --framework "
            f"{args.framework}` again to go on; the steps' logs are in {logs}"
        )

    try:
        with Ticker(status), raise_after(args.timeout, timed_out):
            result = build_image(args.framework, progress=progress)
    finally:
        status.close(keep=False)
    if result.cached:
        print(f"image {result.name} is up to date (cached)")
    else:
        print(f"image {result.name} built in {result.seconds:.1f} s ({human_size(result.size_bytes)})")
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(asdict(result), indent=2) + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {args.json}: {exc}") from None
    return 0


def _list(args: argparse.Namespace) -> int:
    from elastrain.images.catalog import list_images

    images = list_images()
    if args.output != OutputFormat.TABLE.value:
        print_data([{**asdict(i), "frameworks": list(i.frameworks)} for i in images], args.output)
        return 0
    table = [["NAME", "FRAMEWORKS", "SIZE", "CREATED"]]
    table += [[i.name, ",".join(i.frameworks), human_size(i.size_bytes), i.created] for i in images]
    print(format_table(table))
    if not images:
        print("(no elastrain images: run `elastrain image build`)")
    return 0


def cmd_image(args: argparse.Namespace) -> int:
    """Run `elastrain image build` or `elastrain image list`."""
    if args.image_cmd == "build":
        return _build(args)
    return _list(args)
