"""`build_image`: the offline, cached, two-layer build of an elastrain image.

1. base ``localhost/elastrain-base:<basekey>``: a Debian rootfs (mmdebstrap, itself cached as
   ``localhost/elastrain-rootfs:<rootfskey>``) plus a venv holding torch and the other third-party
   packages, installed from wheels downloaded on the host; skipped, download included, when it exists;
2. for a framework with packages of its own (DeepSpeed): a layer ``localhost/elastrain-layer-<fw>:<key>``
   over the base with those packages (sdists built into wheels on the host), cached the same way;
3. final ``<repo>:<key>`` (also tagged ``:latest``): the base (or layer) plus elastrain's own wheel, the
   recipe's compat wheels and the examples; `key` covers the layer/base key and a hash of the sources,
   so a code edit rebuilds only this.

Every framework image shares the rootfs and the base: a second framework costs its layer and final.
"""

from __future__ import annotations

import fcntl
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from elastrain.backends.podmanctl import podman, podman_json
from elastrain.images import containerfile, keys, rootfs, wheels
from elastrain.images.recipe import (
    BASE_REPO,
    DEB_PACKAGES,
    DPKG_OPTIONS,
    LAYER_REPO,
    RECIPE_VERSION,
    ROOTFS_REPO,
    SUITE,
    VARIANT,
    FrameworkRecipe,
    cache_dir,
    extra_requirements,
    package_version,
    read_constraints,
    recipe_for,
    repo_root_default,
    requirements,
)

# Called with one line per finished step; a callable that also has a ``stage_started(what)`` method
# (the CLI's live status line) hears each step when it starts, too.
Progress = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    """What `build_image` made (or found): the image's keyed name, key, and how long it took."""

    name: str  # "<repo>:<key>"; the same image is also tagged "<repo>:latest"
    key: str
    cached: bool  # True when the image already existed and nothing was built
    seconds: float
    size_bytes: int


def image_exists(ref: str) -> bool:
    """``podman image exists REF``."""
    return podman("image", "exists", ref, check=False, timeout=60).returncode == 0


def image_labels_and_size(ref: str) -> tuple[dict[str, str], int]:
    """The labels and size in bytes of image `ref`."""
    data = podman_json("image", "inspect", ref, "--format", "json")
    entry = data[0] if isinstance(data, list) and data else {}
    return dict(entry.get("Labels") or {}), int(entry.get("Size") or 0)


@contextmanager
def _step(progress: Progress, what: str) -> Iterator[None]:
    stage_started = getattr(progress, "stage_started", None)
    if stage_started is not None:
        stage_started(what)
    start = time.monotonic()
    yield
    progress(f"  {what} ({time.monotonic() - start:.1f} s)")


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One build at a time per cache directory (two would race on the same tags and contexts)."""
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _fresh_dir(path: Path) -> Path:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def _torch_version(wheel_names: list[str]) -> str:
    for name in wheel_names:
        if name.lower().startswith("torch-"):
            return name.split("-")[1]
    return ""


def _ensure_rootfs(rootfs_ref: str, cache: Path, progress: Progress) -> None:
    if image_exists(rootfs_ref):
        progress(f"  rootfs {rootfs_ref} cached")
        return
    tarball = cache / f"{rootfs_ref.rsplit(':', 1)[1]}.rootfs.tar"
    mirrors = rootfs.host_mirror_entries(SUITE)
    argv = rootfs.mmdebstrap_argv(SUITE, VARIANT, DEB_PACKAGES, DPKG_OPTIONS, tarball, mirrors)
    try:
        with _step(progress, f"rootfs: mmdebstrap {SUITE} {VARIANT} + {len(DEB_PACKAGES)} packages"):
            rootfs.make_rootfs(argv, cache / "logs" / "mmdebstrap.log")
        with _step(progress, f"rootfs: podman import -> {rootfs_ref}"):
            rootfs.import_rootfs(tarball, rootfs_ref)
    finally:
        tarball.unlink(missing_ok=True)


def _ensure_base(
    base_ref: str, rootfs_ref: str, reqs: list[str], constraints: str, cache: Path, progress: Progress
) -> None:
    if image_exists(base_ref):
        progress(f"  base {base_ref} cached")
        return
    _ensure_rootfs(rootfs_ref, cache, progress)
    python = rootfs.python_version(rootfs_ref)
    context = _fresh_dir(cache / f"base-{base_ref.rsplit(':', 1)[1]}")
    with _step(progress, f"wheels: pip download {len(reqs)} requirements for Python {python}"):
        names = wheels.download_dependencies(
            reqs, constraints, context / "wheels", ".".join(python.split(".")[:2])
        )
    labels = {
        "elastrain.layer": "base",
        "elastrain.base.key": base_ref.rsplit(":", 1)[1],
        "elastrain.python": python,
        "elastrain.torch": _torch_version(names),
        "elastrain.wheels": keys.digest(names),
    }
    text = containerfile.base_containerfile(rootfs_ref, labels)
    containerfile.write_base_files(context)
    with _step(progress, f"base: venv with {len(names)} wheels -> {base_ref}"):
        containerfile.podman_build(context, text, [base_ref], cache / "logs" / "base-build.log")
    shutil.rmtree(context, ignore_errors=True)


def _ensure_layer(
    layer_ref: str,
    base_ref: str,
    recipe: FrameworkRecipe,
    reqs: list[str],
    constraints: str,
    cache: Path,
    progress: Progress,
) -> None:
    if image_exists(layer_ref):
        progress(f"  layer {layer_ref} cached")
        return
    base_labels, _ = image_labels_and_size(base_ref)
    python = base_labels.get("elastrain.python", "")
    context = _fresh_dir(cache / f"layer-{layer_ref.rsplit(':', 1)[1]}")
    with _step(progress, f"wheels: pip wheel {', '.join(reqs)} (the {recipe.framework} layer)"):
        names = wheels.framework_wheels(
            reqs,
            constraints,
            context / "wheels",
            ".".join(python.split(".")[:2]),
            dict(recipe.layer_build_env),
        )
    labels = {
        "elastrain.layer": f"layer-{recipe.framework}",
        "elastrain.base.key": base_labels.get("elastrain.base.key", ""),
        "elastrain.python": python,
        "elastrain.torch": base_labels.get("elastrain.torch", ""),
        "elastrain.wheels": keys.digest(names),
    }
    text = containerfile.layer_containerfile(base_ref, labels)
    with _step(progress, f"layer: {recipe.framework} packages -> {layer_ref}"):
        containerfile.podman_build(
            context, text, [layer_ref], cache / "logs" / f"layer-{recipe.framework}.log"
        )
    shutil.rmtree(context, ignore_errors=True)


def _build_final(
    recipe: FrameworkRecipe,
    root: Path,
    files: list[str],
    base_ref: str,
    key: str,
    cache: Path,
    progress: Progress,
) -> None:
    base_labels, _ = image_labels_and_size(base_ref)
    context = _fresh_dir(cache / f"final-{key}")
    stage = cache / "src"
    with _step(progress, "wheel: elastrain (pip wheel of the staged sources)"):
        wheels.stage_sources(root, files, stage)
        wheel = wheels.build_elastrain_wheel(stage, context / "dist")
        dist = [wheel.name]
        for compat in recipe.compat:
            dist.append(wheels.build_local_wheel(stage / compat, context / "dist").name)
        wheels.copy_examples(root, files, context / "examples")
    labels = {
        "elastrain.image": "true",
        "elastrain.layer": "final",
        "elastrain.frameworks": ",".join(recipe.frameworks),
        "elastrain.framework": recipe.framework,
        "elastrain.key": key,
        "elastrain.version": package_version(root),
        "elastrain.python": base_labels.get("elastrain.python", ""),
        "elastrain.torch": base_labels.get("elastrain.torch", ""),
    }
    text = containerfile.final_containerfile(base_ref, dist, labels)
    tags = [f"{recipe.repo}:{key}", f"{recipe.repo}:latest"]
    with _step(progress, f"final: elastrain {labels['elastrain.version']} + examples -> {tags[0]}"):
        containerfile.podman_build(context, text, tags, cache / "logs" / "final-build.log")
    shutil.rmtree(context, ignore_errors=True)
    shutil.rmtree(stage, ignore_errors=True)


def _prune_older(repo: str, key: str, progress: Progress) -> None:
    """Remove the earlier builds of `repo` (their keyed tags); one still used by a container stays."""
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}", repo, check=False, timeout=60)
    old = {
        ref
        for ref in listed.stdout.split()
        if ref.startswith(f"{repo}:") and ref.split(":")[-1] not in (key, "latest")
    }
    for ref in sorted(old):
        if podman("rmi", ref, check=False, timeout=120).returncode == 0:
            progress(f"  removed the earlier build {ref}")


def build_image(
    framework: str = "pytorch", progress: Progress = print, repo_root: Path | None = None
) -> BuildResult:
    """Build (or find cached) the image of `framework` from the sources in `repo_root`.

    Raises `ConfigError` for a framework that cannot be built yet, a missing mmdebstrap, or a failed
    wheel download; `PodmanError` when podman is missing or a podman step fails (with its log's path).
    """
    recipe = recipe_for(framework)
    root = (repo_root or repo_root_default()).resolve()
    start = time.monotonic()
    cache = cache_dir()
    (cache / "logs").mkdir(parents=True, exist_ok=True)
    with _locked(cache / ".lock"):
        constraints = read_constraints(root)
        reqs = requirements(root)
        layer_reqs = extra_requirements(root, recipe.layer_extras)
        rootfs_key = keys.rootfs_key(SUITE, VARIANT, DEB_PACKAGES, DPKG_OPTIONS)
        version = RECIPE_VERSION + keys.digest([containerfile.SSH_CLIENT_CONFIG])
        base_key = keys.base_key(version, rootfs_key, constraints, reqs)
        layer_inputs = [*layer_reqs, *(f"{k}={v}" for k, v in recipe.layer_build_env)]
        under_key = keys.layer_key(base_key, recipe.framework, layer_inputs) if layer_reqs else base_key
        files = keys.source_files(root)
        key = keys.final_key(under_key, keys.source_hash(root, files), recipe.framework)
        name = f"{recipe.repo}:{key}"
        cached = image_exists(name)
        if cached:
            podman("tag", name, f"{recipe.repo}:latest", timeout=60)
            progress(f"  {name} exists: nothing to build")
        else:
            base_ref = f"{BASE_REPO}:{base_key}"
            _ensure_base(base_ref, f"{ROOTFS_REPO}:{rootfs_key}", reqs, constraints, cache, progress)
            if layer_reqs:
                layer_ref = f"{LAYER_REPO}-{recipe.framework}:{under_key}"
                _ensure_layer(layer_ref, base_ref, recipe, layer_reqs, constraints, cache, progress)
                base_ref = layer_ref
            _build_final(recipe, root, files, base_ref, key, cache, progress)
            _prune_older(recipe.repo, key, progress)
        _, size = image_labels_and_size(name)
    return BuildResult(
        name=name, key=key, cached=cached, seconds=round(time.monotonic() - start, 2), size_bytes=size
    )
