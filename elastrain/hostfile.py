"""The hostfile format: ``host slots=N`` lines (OpenMPI / Horovod / DeepSpeed), versioned.

A hostfile written by elastrain starts with ``# generation: G``; readers accept any hostfile in the
format (blank lines and ``#`` comments allowed). Writes are atomic: a temp file in the same directory
is renamed into place, so a reader never sees half a file.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from elastrain.errors import HostfileError

_GENERATION_RE = re.compile(r"^#\s*generation:\s*(\d+)\s*$")
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")


@dataclass(frozen=True)
class Host:
    """One line of a hostfile: a host name or address and how many worker slots it has."""

    name: str
    slots: int = 1


@dataclass(frozen=True)
class Hostfile:
    """A parsed hostfile: its generation (0 when absent) and its hosts, in file order."""

    hosts: tuple[Host, ...] = ()
    generation: int = 0
    comments: tuple[str, ...] = field(default=(), compare=False)

    @property
    def total_slots(self) -> int:
        """Sum of the slots of every host."""
        return sum(h.slots for h in self.hosts)

    def slots_by_host(self) -> dict[str, int]:
        """Host name -> slots, in file order."""
        return {h.name: h.slots for h in self.hosts}


def _parse_slots(value: str, where: str) -> int:
    try:
        slots = int(value)
    except ValueError:
        raise HostfileError(f"{where}: slots={value!r} is not a number; write e.g. 'host slots=1'") from None
    if slots < 1:
        raise HostfileError(f"{where}: slots={slots} must be at least 1; remove the line to drop the host")
    return slots


def parse_hostfile(text: str, source: str = "<hostfile>") -> Hostfile:
    """Parse hostfile text. Duplicate hosts are refused; `source` names the file in errors."""
    hosts: dict[str, Host] = {}
    generation = 0
    comments: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        where = f"{source}:{lineno}"
        if not line:
            continue
        if line.startswith("#"):
            match = _GENERATION_RE.match(line)
            if match:
                generation = int(match.group(1))
            else:
                comments.append(line)
            continue
        line = line.split("#", 1)[0].strip()
        parts = line.split()
        name = parts[0]
        if "=" in name:
            raise HostfileError(f"{where}: line starts with {name!r}, not a host; write 'HOST slots=N'")
        if not _HOST_RE.match(name):
            raise HostfileError(f"{where}: {name!r} is not a valid host name or address")
        slots = 1
        for option in parts[1:]:
            key, sep, value = option.partition("=")
            if key in ("slots", "max_slots", "max-slots") and sep:
                if key == "slots":
                    slots = _parse_slots(value, where)
            elif ":" in option and not sep:
                raise HostfileError(f"{where}: unexpected {option!r}; write 'HOST slots=N'")
            else:
                raise HostfileError(f"{where}: unknown option {option!r}; the format is 'HOST slots=N'")
        if name in hosts:
            raise HostfileError(
                f"{where}: host {name!r} is listed twice; keep one line per host and sum its slots there"
            )
        hosts[name] = Host(name, slots)
    return Hostfile(tuple(hosts.values()), generation, tuple(comments))


def parse_host_list(spec: str) -> Hostfile:
    """Parse a horovodrun ``-H host1:2,host2:4`` list (slots default to 1)."""
    hosts: dict[str, Host] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        has_slots = item.count(":") == 1 or (item.startswith("[") and "]:" in item)  # [v6-addr]:SLOTS
        name, sep, slots_text = item.rpartition(":") if has_slots else (item, "", "")
        if not sep:
            name, slots = item, 1
        else:
            slots = _parse_slots(slots_text, f"-H {spec}")
        if not name or not _HOST_RE.match(name):
            raise HostfileError(f"-H {spec}: {item!r} is not HOST or HOST:SLOTS")
        if name in hosts:
            raise HostfileError(f"-H {spec}: host {name!r} is listed twice; list each host once")
        hosts[name] = Host(name, slots)
    if not hosts:
        raise HostfileError(f"-H {spec!r}: no hosts given; write e.g. -H 127.0.0.2:1,127.0.0.3:1")
    return Hostfile(tuple(hosts.values()))


def render_hostfile(hostfile: Hostfile) -> str:
    """Render a hostfile: the generation line, then one ``host slots=N`` line per host."""
    lines = [f"# generation: {hostfile.generation}"]
    lines += [f"{h.name} slots={h.slots}" for h in hostfile.hosts]
    return "\n".join(lines) + "\n"


def render_discovery(hostfile: Hostfile) -> str:
    """Render ``host:slots`` lines, the output format of a horovodrun host-discovery script."""
    return "".join(f"{h.name}:{h.slots}\n" for h in hostfile.hosts)


def read_hostfile(path: str | os.PathLike[str]) -> Hostfile:
    """Read and parse a hostfile from disk."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise HostfileError(f"hostfile {p} does not exist; create it or fix the --hostfile path") from None
    except OSError as exc:
        raise HostfileError(f"hostfile {p} cannot be read: {exc.strerror}") from None
    return parse_hostfile(text, str(p))


def write_hostfile(path: str | os.PathLike[str], hosts: Iterable[Host], generation: int) -> Hostfile:
    """Atomically write a hostfile (temp file + rename) and return what was written."""
    hostfile = Hostfile(tuple(hosts), generation)
    atomic_write_text(Path(path), render_hostfile(hostfile))
    return hostfile


def atomic_write_text(path: Path, text: str) -> None:
    """Write `text` to `path` so readers see either the old or the new content, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
