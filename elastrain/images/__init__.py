"""OCI images for elastrain jobs, built offline with mmdebstrap + podman (`elastrain image build`).

`catalog` lists and finds the images podman holds; `build` makes them. Importing this package needs
neither podman nor mmdebstrap: they are looked for only when used.
"""

from __future__ import annotations

from elastrain.images.build import BuildResult, build_image
from elastrain.images.catalog import (
    FRAMEWORK_IMAGES,
    ImageInfo,
    default_image_for,
    find_image,
    list_images,
)

__all__ = [
    "FRAMEWORK_IMAGES",
    "BuildResult",
    "ImageInfo",
    "build_image",
    "default_image_for",
    "find_image",
    "list_images",
]
