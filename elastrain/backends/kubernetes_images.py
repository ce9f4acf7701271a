"""Which images the Kubernetes backend's pods run: the container backend's images (``elastrain image
build``), named as the cluster's nodes pull them (the server's ``--k8s-image-registry``, where
``elastrain image build`` images are pushed; without one the names stay podman's ``localhost/...``).

Where this machine has podman, its store says which images exist; elsewhere (a server running in a
pod) each framework's image is listed by its conventional name, and the registry decides at pull
time (a missing image shows as the pod's ``ErrImagePull`` reason).
"""

from __future__ import annotations

from elastrain.backends.api import ImageEntry
from elastrain.backends.kubernetes_objects import image_reference


def _podman_entries() -> list[ImageEntry] | None:
    from elastrain.backends.podmanctl import PodmanError, podman_path

    if podman_path() is None:
        return None
    from elastrain.backends.container_images import image_entries as podman_entries

    try:
        return podman_entries()
    except PodmanError:
        return None


def image_entries(registry: str) -> list[ImageEntry]:
    """The images clusters can name (see the module docstring)."""
    from elastrain.images.catalog import FRAMEWORK_IMAGES, normalize_name

    found = _podman_entries()
    if found:
        return [
            ImageEntry(
                image_reference(e.name, registry),
                e.frameworks,
                e.size_bytes,
                e.created,
                e.description,
                e.default_for,
            )
            for e in found
        ]
    return [
        ImageEntry(
            image_reference(normalize_name(repo), registry),
            (framework,),
            description=f"the {framework} image (elastrain image build --framework {framework})",
            default_for=(framework,),
        )
        for framework, repo in sorted(FRAMEWORK_IMAGES.items())
    ]


def resolve_image(image: str, framework: str, registry: str) -> str:
    """The image a cluster of `framework` runs: the one named (as the nodes pull it), else the
    framework's default; ValueError (what to do) for a framework no image can hold."""
    from elastrain.images.recipe import UNAVAILABLE_FRAMEWORKS

    if image and image != "local":
        return image_reference(image, registry)
    if framework in UNAVAILABLE_FRAMEWORKS:
        raise ValueError(f"framework {framework!r} is not available: {UNAVAILABLE_FRAMEWORKS[framework]}")
    defaults = [e for e in image_entries(registry) if framework in e.default_for]
    if not defaults:
        raise ValueError(
            f"no image holds framework {framework!r}; build one (elastrain image build --framework "
            f"{framework}) and push it to the registry the nodes pull from"
        )
    return defaults[0].name
