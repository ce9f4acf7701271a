"""Wheels for the offline image build: the third-party ones (``pip download`` on the host, from its
configured find-links and local indexes) and elastrain's own (built from a staged copy of the sources,
so nothing is written into the source tree)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from elastrain.errors import ConfigError

_NOISE = ("is ignored: it is neither a file nor a directory", "[notice]")


def _pip(args: Sequence[str], what: str, timeout: float, env: Mapping[str, str] | None = None) -> None:
    argv = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *args]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **env} if env else None,
        )
    except subprocess.TimeoutExpired:
        raise ConfigError(f"pip {what} did not finish within {timeout:.0f} s") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip() and not any(n in ln for n in _NOISE)]
        raise ConfigError(f"pip {what} failed: {lines[-1] if lines else '(no message)'}")


def download_dependencies(
    requirements: Sequence[str], constraints: str, dest: Path, python: str, timeout: float = 900.0
) -> list[str]:
    """``pip download`` binary wheels of `requirements` for CPython `python` (``X.Y``) into `dest`.

    `dest` also receives ``requirements.txt`` and ``constraints.txt`` for the install in the image.
    Returns the wheel file names; `ConfigError` when torch is not a CPU (``+cpu``) wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    (dest / "constraints.txt").write_text(constraints)
    args = ["download", "--quiet", "--only-binary=:all:", "--python-version", python, "-d", str(dest)]
    _pip(
        [*args, "-c", str(dest / "constraints.txt"), "-r", str(dest / "requirements.txt")],
        "download",
        timeout,
    )
    names = sorted(p.name for p in dest.glob("*.whl"))
    torch = [n for n in names if n.lower().startswith("torch-")]
    if not torch:
        raise ConfigError(f"pip download fetched no torch wheel into {dest}")
    if any("+cpu" not in n for n in torch):
        raise ConfigError(
            f"pip chose {torch[0]}, not a CPU (+cpu) torch wheel; put the CPU wheel of the pinned "
            "version in pip's find-links (it would otherwise pull gigabytes of CUDA)"
        )
    return names


def framework_wheels(
    requirements: Sequence[str],
    constraints: str,
    dest: Path,
    python: str,
    build_env: Mapping[str, str] | None = None,
    timeout: float = 1800.0,
) -> list[str]:
    """Wheels of a framework layer's `requirements` into `dest`, sdists built into wheels here.

    ``pip wheel`` builds for the host's Python, so the host's ``X.Y`` must be the image's `python`;
    sdists build against this venv's torch (the pinned one: no build isolation), with `build_env`
    (e.g. DeepSpeed's ``DS_BUILD_*`` switches that compile its CPU ops ahead, so the image needs no
    compiler), never from pip's wheel cache (a cached wheel may have been built without them).
    `dest` also receives ``requirements.txt`` and ``constraints.txt``; returns the wheel file names.
    """
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    if host != python:
        raise ConfigError(
            f"the framework's packages are built as wheels for this Python ({host}), but the image has "
            f"Python {python}; build the image with a Python {python} venv"
        )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "requirements.txt").write_text("".join(f"{r}\n" for r in requirements))
    (dest / "constraints.txt").write_text(constraints)
    _pip(
        [
            "wheel",
            "--quiet",
            "--no-cache-dir",
            "--no-build-isolation",
            "-w",
            str(dest),
            "-c",
            str(dest / "constraints.txt"),
            "-r",
            str(dest / "requirements.txt"),
        ],
        "wheel (framework packages)",
        timeout,
        env=build_env,
    )
    return sorted(p.name for p in dest.glob("*.whl"))


def build_local_wheel(source: Path, dist: Path, timeout: float = 300.0) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` a directory of the source tree into `dist`."""
    before = set(dist.glob("*.whl")) if dist.exists() else set()
    dist.mkdir(parents=True, exist_ok=True)
    _pip(
        ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)],
        "wheel",
        timeout,
    )
    made = sorted(set(dist.glob("*.whl")) - before)
    if len(made) != 1:
        raise ConfigError(f"building a wheel of {source} left {len(made)} new wheels in {dist}")
    return made[0]


def stage_sources(repo_root: Path, files: Sequence[str], stage: Path) -> None:
    """Copy the package sources (`files` minus the examples) to `stage`, a fresh directory."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for rel in files:
        if rel.startswith("examples/"):
            continue
        target = stage / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo_root / rel, target)


def build_elastrain_wheel(stage: Path, dist: Path, timeout: float = 300.0) -> Path:
    """``pip wheel --no-deps --no-build-isolation`` the staged sources into `dist`; the wheel's path."""
    if dist.exists():
        shutil.rmtree(dist)
    dist.mkdir(parents=True)
    _pip(
        ["wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", str(dist), str(stage)],
        "wheel",
        timeout,
    )
    wheels = sorted(dist.glob("elastrain-*.whl"))
    if len(wheels) != 1:
        raise ConfigError(f"building the elastrain wheel left {len(wheels)} wheels in {dist}")
    return wheels[0]


def copy_examples(repo_root: Path, files: Sequence[str], dest: Path) -> int:
    """Copy the examples among `files` to `dest`, world-readable; how many were copied."""
    count = 0
    for rel in files:
        if not rel.startswith("examples/"):
            continue
        src = repo_root / rel
        target = dest / Path(rel).relative_to("examples")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)
        target.chmod(0o755 if src.stat().st_mode & 0o111 else 0o644)
        count += 1
    for d in [dest, *(p for p in dest.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    return count
