"""The container backend's images: which elastrain images podman holds, and which one a new cluster runs."""

from __future__ import annotations

from elastrain.backends.api import ImageEntry


def image_entries() -> list[ImageEntry]:
    """The elastrain images in podman's store (`elastrain image build` makes them), one per image."""
    from elastrain.images.catalog import list_images, pick_default

    infos = list_images()
    defaults = {f: pick_default(infos, f) for i in infos for f in i.frameworks}
    by_id: dict[str, ImageEntry] = {}
    for i in infos:  # one entry per image: its :latest tag where it has one
        if i.id not in by_id or i.name.endswith(":latest"):
            default_for = tuple(f for f, d in sorted(defaults.items()) if d is not None and d.id == i.id)
            by_id[i.id] = ImageEntry(
                i.name, i.frameworks, i.size_bytes, i.created, f"OCI image {i.id[:12]}", default_for
            )
    return list(by_id.values())


def resolve_image(image: str, framework: str) -> str:
    """The named image, or the newest holding `framework`; ValueError (what to do) when none fits."""
    from elastrain.images.catalog import default_image_for, find_image, list_images
    from elastrain.images.recipe import UNAVAILABLE_FRAMEWORKS

    build = f"elastrain image build --framework {framework}"
    if framework in UNAVAILABLE_FRAMEWORKS and default_image_for(framework) is None:
        raise ValueError(f"framework {framework!r} is not available: {UNAVAILABLE_FRAMEWORKS[framework]}")
    if not image or image == "local":
        found = default_image_for(framework)
        if found is None:
            raise ValueError(
                f"no image holds framework {framework!r}; build one first ({build}) or pick another framework"
            )
        return found.name
    info = find_image(image)
    if info is None:
        known = ", ".join(sorted({i.name for i in list_images()})) or "none yet"
        raise ValueError(f"unknown image {image!r} (images: {known}); build one with `{build}`")
    if framework not in info.frameworks:
        fitting = default_image_for(framework)
        hint = f"use image {fitting.name}" if fitting is not None else f"build one with `{build}`"
        raise ValueError(
            f"image {info.name} holds {', '.join(info.frameworks) or 'no framework'}, not {framework}; {hint}"
        )
    return info.name
