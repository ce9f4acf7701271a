"""What goes into an elastrain image: the Debian rootfs, the Python requirements, the paths inside.

Everything here is data (plus small readers of the repo's own files), so the cache keys in
`elastrain.images.keys` can be computed from it without building or downloading anything.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# Bump when the way the base or final image is assembled changes (it is part of every cache key).
RECIPE_VERSION = "2"

SUITE = "bookworm"
VARIANT = "minbase"
# One rootfs for every framework image (the frameworks' own Debian packages add ~20 MB): sshd, ssh and
# pdsh for DeepSpeed's multi-node launcher and "connect by SSH"; slurm-wlm and munge for the Slurm image.
DEB_PACKAGES: tuple[str, ...] = (
    "python3",
    "python3-venv",
    "procps",
    "iproute2",
    "ca-certificates",
    "less",
    "openssh-server",
    "openssh-client",
    "pdsh",
    "slurm-wlm",
    "munge",
)
# Documentation and translations are of no use in a training image; copyright files stay.
DPKG_OPTIONS: tuple[str, ...] = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/info/*",
)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

VENV = "/opt/elastrain/venv"
EXAMPLES_DIR = "/opt/elastrain/examples"
ROOTFS_REPO = "localhost/elastrain-rootfs"
BASE_REPO = "localhost/elastrain-base"
LAYER_REPO = "localhost/elastrain-layer"  # + "-<framework>"


@dataclass(frozen=True)
class FrameworkRecipe:
    """One buildable image: its repository, the frameworks it really holds, what it adds to the base.

    Every image shares the rootfs and the base venv (torch and elastrain's dependencies); a framework
    with `layer_extras` gets a layer of its own over the base (the pyproject extras' packages, e.g. the
    real ``deepspeed``); `compat` are directories of the source tree built as wheels into the final
    layer (e.g. ``compat/horovod``: elastrain's implementation of the Horovod API as ``horovod``).
    """

    framework: str
    repo: str
    frameworks: tuple[str, ...]
    layer_extras: tuple[str, ...] = ()
    compat: tuple[str, ...] = ()
    layer_build_env: tuple[tuple[str, str], ...] = ()  # environment of the layer's ``pip wheel``


# the elastrain extras every image's base venv holds (server: the client commands in the terminal;
# notebook: JupyterLab, which a launcher runs; tensorboard: `elastrain run --tensorboard-dir`)
BASE_EXTRAS: tuple[str, ...] = ("examples", "server", "notebook", "tensorboard")

RECIPES: dict[str, FrameworkRecipe] = {
    "pytorch": FrameworkRecipe("pytorch", "localhost/elastrain-pytorch", ("pytorch",)),
    "horovod": FrameworkRecipe(
        "horovod", "localhost/elastrain-horovod", ("horovod", "pytorch"), compat=("compat/horovod",)
    ),
    "deepspeed": FrameworkRecipe(
        "deepspeed",
        "localhost/elastrain-deepspeed",
        ("deepspeed", "pytorch"),
        layer_extras=("deepspeed",),
        # DeepSpeed's CPU backend JIT-compiles its shared-memory allreduce at the first
        # init_distributed (45 s, and a C++ compiler in the image): compile it into the wheel instead
        layer_build_env=(("DS_BUILD_OPS", "0"), ("DS_BUILD_SHM_COMM", "1")),
    ),
    "slurm": FrameworkRecipe("slurm", "localhost/elastrain-slurm", ("slurm", "pytorch")),
    # the real megatron-core; its CPU/gloo shim (elastrain.frameworks.megatron_cpu) comes with elastrain
    "megatron": FrameworkRecipe(
        "megatron", "localhost/elastrain-megatron", ("megatron", "pytorch"), layer_extras=("megatron",)
    ),
}
# Frameworks other parts of elastrain know of, whose images cannot be built (the reason is shown).
UNAVAILABLE_FRAMEWORKS: dict[str, str] = {}


def recipe_for(framework: str) -> FrameworkRecipe:
    """The recipe of `framework`; `ConfigError` naming the buildable ones otherwise."""
    recipe = RECIPES.get(framework)
    if recipe is None:
        can = ", ".join(sorted(RECIPES))
        why = UNAVAILABLE_FRAMEWORKS.get(framework)
        if why:
            raise ConfigError(f"cannot build an image for framework {framework!r}: {why}; can build: {can}")
        raise ConfigError(f"unknown framework {framework!r}; can build: {can}")
    return recipe


def repo_root_default() -> Path:
    """The source tree this package was loaded from (the directory holding pyproject.toml)."""
    here = Path(__file__).resolve().parents[2]
    if not (here / "pyproject.toml").is_file():
        raise ConfigError(
            f"no pyproject.toml in {here}: images are built from an elastrain source checkout "
            "(pass repo_root)"
        )
    return here


def cache_dir() -> Path:
    """Where build contexts and wheels go: $ELASTRAIN_CACHE_DIR or ~/.cache/elastrain/images."""
    env = os.environ.get("ELASTRAIN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "elastrain" / "images"


def read_pyproject(repo_root: Path) -> dict[str, Any]:
    """The parsed pyproject.toml of `repo_root`."""
    path = repo_root / "pyproject.toml"
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def read_constraints(repo_root: Path) -> str:
    """The text of `repo_root`/constraints.txt (the one place the torch version is pinned)."""
    path = repo_root / "constraints.txt"
    try:
        return path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None


def pinned_version(constraints: str, package: str) -> str:
    """The ``package==X`` pin in a constraints text; `ConfigError` when there is none."""
    pattern = re.compile(rf"^\s*{re.escape(package)}\s*==\s*([^\s;#]+)", re.IGNORECASE | re.MULTILINE)
    match = pattern.search(constraints)
    if match is None:
        raise ConfigError(f"constraints.txt pins no {package} version (expected a line '{package}==X.Y.Z')")
    return match.group(1)


def extra_requirements(repo_root: Path, extras: tuple[str, ...]) -> list[str]:
    """The requirements of pyproject.toml's optional-dependencies `extras`."""
    optional = read_pyproject(repo_root).get("project", {}).get("optional-dependencies", {})
    reqs: list[str] = []
    for extra in extras:
        if extra not in optional:
            raise ConfigError(f"pyproject.toml has no optional-dependencies extra {extra!r}")
        reqs += optional[extra]
    return reqs


def requirements(repo_root: Path) -> list[str]:
    """The third-party requirements of the shared base: the package's dependencies, its extras, torch."""
    project = read_pyproject(repo_root).get("project", {})
    reqs: list[str] = list(project.get("dependencies", []))
    reqs += extra_requirements(repo_root, BASE_EXTRAS)
    reqs.append(f"torch=={pinned_version(read_constraints(repo_root), 'torch')}")
    return reqs


def package_version(repo_root: Path) -> str:
    """The elastrain version declared in pyproject.toml."""
    version = read_pyproject(repo_root).get("project", {}).get("version")
    if not isinstance(version, str):
        raise ConfigError("pyproject.toml declares no [project] version")
    return version
