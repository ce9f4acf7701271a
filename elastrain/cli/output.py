"""``-o table|json|yaml``: how the CLI's get/list commands print, and the machine-readable renderings.

Table rendering stays with each command (`elastrain.cli.table`); JSON and YAML print the same data
(the API's stable shapes), so a script can switch between them. Under ``-w`` each change is one
JSON line or one YAML document (``---``), as ``kubectl get -w`` does.
"""

from __future__ import annotations

import argparse
import enum
import json
import sys
from typing import Any

from elastrain.errors import ConfigError


class OutputFormat(str, enum.Enum):
    """The values of ``-o/--output``."""

    TABLE = "table"
    JSON = "json"
    YAML = "yaml"


def add_output_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``-o/--output table|json|yaml`` to an argparse parser (default table)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=[f.value for f in OutputFormat],
        default=OutputFormat.TABLE.value,
        help="table (default), json or yaml",
    )


def to_yaml(data: Any) -> str:
    """`data` (JSON-shaped: dicts, lists, strings, numbers, None) as block-style YAML, keys in order."""
    try:
        import yaml
    except ImportError:
        raise ConfigError("-o yaml needs PyYAML: pip install pyyaml (or use -o json)") from None
    return str(yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True))


def render(data: Any, fmt: OutputFormat | str) -> str:
    """`data` as an indented JSON document or a YAML document (no trailing newline)."""
    if OutputFormat(fmt) is OutputFormat.YAML:
        return to_yaml(data).rstrip("\n")
    if OutputFormat(fmt) is OutputFormat.JSON:
        return json.dumps(data, indent=2)
    raise ValueError("render() prints json or yaml; tables are the command's own")


def render_change(data: Any, fmt: OutputFormat | str) -> str:
    """One change under ``-w``: a compact JSON line, or a YAML document opened by ``---``."""
    if OutputFormat(fmt) is OutputFormat.YAML:
        return "---\n" + to_yaml(data).rstrip("\n")
    return json.dumps(data, separators=(",", ":"))


def print_data(data: Any, fmt: OutputFormat | str) -> None:
    """Print `data` as JSON or YAML on stdout."""
    sys.stdout.write(render(data, fmt) + "\n")
