"""The elastrain images podman holds: listing, lookup by name, the default image of a framework.

An elastrain image carries the label ``elastrain.image=true``; ``elastrain.frameworks`` lists the
frameworks it really holds (comma-separated) and ``elastrain.key`` its content key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from elastrain.backends.podmanctl import podman_json
from elastrain.images.recipe import RECIPES

LABEL = "elastrain.image"
# framework -> the image repository `elastrain image build --framework NAME` makes
FRAMEWORK_IMAGES: dict[str, str] = {name: recipe.repo for name, recipe in RECIPES.items()}
DEFAULT_REGISTRY = "localhost"


@dataclass(frozen=True)
class ImageInfo:
    """One tag of an elastrain image (an image with two tags is two entries)."""

    name: str  # e.g. "localhost/elastrain-pytorch:latest"
    frameworks: tuple[str, ...]
    size_bytes: int
    created: str  # RFC 3339, UTC, with Z
    key: str
    id: str  # full image ID


def _rfc3339(value: Any) -> str:
    """podman's ``Created`` (Unix seconds) as ``YYYY-MM-DDTHH:MM:SSZ``."""
    try:
        stamp = datetime.fromtimestamp(int(value), tz=timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return ""
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def _frameworks(labels: dict[str, str]) -> tuple[str, ...]:
    raw = labels.get("elastrain.frameworks", "")
    return tuple(f.strip() for f in raw.split(",") if f.strip())


def infos_from_podman(entries: list[dict[str, Any]]) -> list[ImageInfo]:
    """`ImageInfo` entries (one per tag) from ``podman images --format json`` output."""
    out = []
    seen: set[tuple[str, str]] = set()  # podman 4.3 repeats an image once per tag
    for entry in entries:
        labels = entry.get("Labels") or {}
        if labels.get(LABEL) != "true":
            continue
        for name in entry.get("Names") or []:
            if (name, str(entry.get("Id", ""))) in seen:
                continue
            seen.add((name, str(entry.get("Id", ""))))
            out.append(
                ImageInfo(
                    name=name,
                    frameworks=_frameworks(labels),
                    size_bytes=int(entry.get("Size") or 0),
                    created=_rfc3339(entry.get("Created")),
                    key=labels.get("elastrain.key", ""),
                    id=str(entry.get("Id", "")),
                )
            )
    return sorted(out, key=lambda i: (i.name.rsplit(":", 1)[0], i.created, i.name))


def list_images() -> list[ImageInfo]:
    """Every tag of every elastrain image podman holds (`PodmanError` when podman cannot answer)."""
    entries = podman_json("images", "--filter", f"label={LABEL}=true", "--format", "json")
    return infos_from_podman(entries if isinstance(entries, list) else [])


def normalize_name(name: str) -> str:
    """``elastrain-pytorch`` -> ``localhost/elastrain-pytorch:latest`` (registry and tag filled in)."""
    name = name.strip()
    first, sep, _rest = name.partition("/")
    has_registry = bool(sep) and ("." in first or ":" in first or first == DEFAULT_REGISTRY)
    if not has_registry:
        name = f"{DEFAULT_REGISTRY}/{name}"
    last = name.rsplit("/", 1)[-1]
    if ":" not in last and "@" not in last:
        name += ":latest"
    return name


def find_image(name: str) -> ImageInfo | None:
    """The elastrain image called `name` (registry and ``:latest`` optional; an ID prefix works too)."""
    images = list_images()
    wanted = normalize_name(name)
    for info in images:
        if info.name == wanted:
            return info
    short = name.strip().removeprefix("sha256:").lower()
    if len(short) >= 12 and all(c in "0123456789abcdef" for c in short):
        for info in images:
            if info.id.startswith(short):
                return info
    return None


def pick_default(images: list[ImageInfo], framework: str) -> ImageInfo | None:
    """Of `images`, the one a cluster of `framework` gets when it names none.

    The framework's own image (``elastrain-<framework>``) wins over a newer image that merely also
    holds the framework (the Slurm image is built on the PyTorch one and would otherwise shadow it
    once built); then the newest; its ``:latest`` tag when it has one.
    """
    candidates = [i for i in images if framework in i.frameworks]
    if not candidates:
        return None
    own = FRAMEWORK_IMAGES.get(framework)
    own_repo = normalize_name(own).rsplit(":", 1)[0] if own else None

    def rank(info: ImageInfo) -> tuple[bool, str, bool, str]:
        is_own = info.name.rsplit(":", 1)[0] == own_repo
        return (is_own, info.created, info.name.endswith(":latest"), info.name)

    return max(candidates, key=rank)


def default_image_for(framework: str) -> ImageInfo | None:
    """The image podman holds that a cluster of `framework` gets when it names none (`pick_default`)."""
    return pick_default(list_images(), framework)
