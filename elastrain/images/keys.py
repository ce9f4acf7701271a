"""Cache keys: short content hashes that name the rootfs, base and final images.

A key changes exactly when something that goes into its image changes, so ``podman image exists``
on the keyed tag decides whether a step can be skipped. None of them needs a download or a build.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterable, Sequence
from pathlib import Path

KEY_LEN = 12
# What `source_files` collects: the package, the metadata setuptools reads, the examples.
# compat/: the shim distributions some images hold (e.g. compat/horovod)
SOURCE_ROOTS: tuple[str, ...] = ("elastrain", "examples", "compat", "pyproject.toml", "README.md")
_SKIP_DIRS = frozenset({"__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "build"})
_SKIP_SUFFIXES = (".pyc", ".pyo")


def digest(parts: Iterable[str]) -> str:
    """First `KEY_LEN` hex digits of sha256 over `parts` (each one length-prefixed: no ambiguity)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(f"{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()[:KEY_LEN]


def rootfs_key(suite: str, variant: str, packages: Sequence[str], dpkg_options: Sequence[str]) -> str:
    """Key of the Debian rootfs image: suite, variant, package list, dpkg path filters."""
    return digest(["rootfs", suite, variant, *sorted(packages), "--", *dpkg_options])


def base_key(
    recipe_version: str,
    rootfs: str,
    constraints: str,
    requirements: Sequence[str],
    wheel_names: Sequence[str] = (),
) -> str:
    """Key of the base image (rootfs + venv with the third-party packages).

    It covers the rootfs key (suite + packages), constraints.txt's text and the requirement list, so
    it is known before any wheel is downloaded; `wheel_names` (the resolved files) can be added where
    they are known, but the build keys without them so a cached base costs no download.
    """
    return digest(
        ["base", recipe_version, rootfs, constraints, "--", *sorted(requirements), "--", *sorted(wheel_names)]
    )


def layer_key(base: str, framework: str, requirements: Sequence[str]) -> str:
    """Key of a framework layer: its base and the framework's requirement list."""
    return digest(["layer", framework, base, "--", *sorted(requirements)])


def final_key(base: str, source: str, framework: str) -> str:
    """Key of the final image: its base plus the hash of the elastrain sources."""
    return digest(["final", framework, base, source])


def _git_files(repo_root: Path) -> list[str] | None:
    """Tracked and untracked-but-not-ignored files under `SOURCE_ROOTS`, or None without git."""
    git = ["git", "-C", str(repo_root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        done = subprocess.run(
            [*git, "--", *SOURCE_ROOTS],
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return sorted({p for p in done.stdout.decode().split("\0") if p})


def _walk_files(repo_root: Path) -> list[str]:
    """The same list without git: every file under `SOURCE_ROOTS` but caches and bytecode."""
    found: list[str] = []
    for root in SOURCE_ROOTS:
        top = repo_root / root
        if top.is_file():
            found.append(root)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
            rel = Path(dirpath).relative_to(repo_root)
            found += [str(rel / name) for name in filenames]
    return sorted(found)


def source_files(repo_root: Path) -> list[str]:
    """Relative paths of the sources that go into the elastrain wheel and the image's examples."""
    listed = _git_files(repo_root)
    files = listed if listed is not None else _walk_files(repo_root)
    return [
        p
        for p in files
        if not p.endswith(_SKIP_SUFFIXES)
        and not set(Path(p).parts) & _SKIP_DIRS
        and (repo_root / p).is_file()  # a tracked file deleted in the work tree is not built
    ]


def source_hash(repo_root: Path, files: Sequence[str] | None = None) -> str:
    """Content hash of the sources (paths, contents and the executable bit), not of build artefacts."""
    parts: list[str] = ["sources"]
    for rel in sorted(files if files is not None else source_files(repo_root)):
        path = repo_root / rel
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        parts += [rel, content, "x" if path.stat().st_mode & 0o111 else "-"]
    return digest(parts)
