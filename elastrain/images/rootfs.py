"""The Debian rootfs: made by mmdebstrap from the host's own apt mirror, imported into podman."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from elastrain.backends.podmanctl import podman, ulimit_args
from elastrain.errors import ConfigError
from elastrain.images.recipe import DEFAULT_PATH

APT_DIR = Path("/etc/apt")


def _suite_matches(entry_suite: str, suite: str) -> bool:
    return entry_suite == suite or entry_suite.startswith(suite + "-")


def _one_line_entries(text: str, suite: str) -> list[str]:
    """``deb ...`` lines of a sources.list for `suite` and its -updates/-security companions."""
    out = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        words = line.split()
        if not words or words[0] != "deb":
            continue
        rest = words[1:]
        if rest and rest[0].startswith("["):  # options: [a=b c=d]
            while rest and not rest[0].endswith("]"):
                rest = rest[1:]
            rest = rest[1:]
        if len(rest) >= 2 and _suite_matches(rest[1], suite):
            out.append(line)
    return out


def _deb822_entries(text: str, suite: str) -> list[str]:
    """The same, from a deb822 ``.sources`` file, as one-line entries."""
    out = []
    for para in text.split("\n\n"):
        fields: dict[str, str] = {}
        key = ""
        for raw in para.splitlines():
            if raw.startswith("#") or not raw.strip():
                continue
            if raw[0].isspace() and key:
                fields[key] += " " + raw.strip()
            elif ":" in raw:
                key, _, value = raw.partition(":")
                key = key.strip().lower()
                fields[key] = value.strip()
        if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
            continue
        signed = fields.get("signed-by", "")
        opts = f"[signed-by={signed}] " if signed.startswith("/") and " " not in signed else ""
        comps = fields.get("components", "main")
        for uri in fields.get("uris", "").split():
            for s in fields.get("suites", "").split():
                if _suite_matches(s, suite):
                    out.append(f"deb {opts}{uri} {s} {comps}")
    return out


def host_mirror_entries(suite: str, apt_dir: Path = APT_DIR) -> list[str]:
    """The host's enabled apt entries for `suite` (so mmdebstrap uses the mirror apt already uses)."""
    entries: list[str] = []
    candidates = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in candidates:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.name == "sources.list" or path.suffix == ".list":
            entries += _one_line_entries(text, suite)
        elif path.suffix == ".sources":
            entries += _deb822_entries(text, suite)
    return list(dict.fromkeys(entries))


def mmdebstrap_argv(
    suite: str,
    variant: str,
    packages: Sequence[str],
    dpkg_options: Sequence[str],
    out: Path,
    mirrors: Sequence[str],
) -> list[str]:
    """The mmdebstrap command line (mirrors empty: mmdebstrap's own default mirror)."""
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ConfigError("mmdebstrap is not installed; install it (apt-get install mmdebstrap)")
    argv = [exe, "--quiet", f"--variant={variant}", f"--include={','.join(packages)}"]
    argv += [f"--dpkgopt={opt}" for opt in dpkg_options]
    return [*argv, suite, str(out), *mirrors]


def make_rootfs(argv: list[str], log: Path, timeout: float = 1200.0) -> None:
    """Run mmdebstrap; `ConfigError` with its last line (and the log's path) when it fails."""
    with log.open("w") as f:
        try:
            done = subprocess.run(
                argv, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            raise ConfigError(f"mmdebstrap did not finish within {timeout:.0f} s (log: {log})") from None
    if done.returncode != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        last = lines[-1] if lines else "(no output)"
        raise ConfigError(f"mmdebstrap failed (exit {done.returncode}): {last} (log: {log})")


def import_rootfs(tarball: Path, ref: str) -> None:
    """``podman import`` the rootfs tarball as image `ref`, with a usable PATH."""
    podman(
        "import",
        "--change",
        f"ENV PATH={DEFAULT_PATH}",
        "--change",
        'CMD ["/bin/bash"]',
        str(tarball),
        ref,
        timeout=600,
    )


def python_version(ref: str) -> str:
    """The python3 version inside image `ref` (e.g. ``3.11.2``)."""
    done = podman(
        "run",
        "--rm",
        "--network",
        "none",
        *ulimit_args(),
        ref,
        "python3",
        "-c",
        "import platform; print(platform.python_version())",
        timeout=120,
    )
    return done.stdout.strip()
