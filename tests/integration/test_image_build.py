"""`elastrain image build`: a real, offline image build (cached after the first time), then run it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from elastrain.backends.podmanctl import podman, podman_works, ulimit_args
from elastrain.images.build import BuildResult, build_image, image_labels_and_size
from elastrain.images.catalog import find_image
from elastrain.images.recipe import pinned_version, read_constraints

REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not podman_works(), reason="podman (with runc) cannot run containers here"),
    pytest.mark.skipif(
        shutil.which("mmdebstrap") is None, reason="mmdebstrap is not installed (apt-get install mmdebstrap)"
    ),
    pytest.mark.timeout(1800),  # a cold build (rootfs + torch venv) takes a minute or two
]


@pytest.fixture(scope="module")
def built() -> BuildResult:
    lines: list[str] = []
    result = build_image("pytorch", progress=lines.append, repo_root=REPO)
    print("\n".join(lines))
    return result


def _run(image: str, *cmd: str) -> str:
    done = podman("run", "--rm", "--network", "none", *ulimit_args(), image, *cmd, timeout=300)
    return done.stdout


def test_image_imports_pinned_torch_and_elastrain(built: BuildResult) -> None:
    out = _run(built.name, "python", "-c", "import torch, elastrain; print(torch.__version__)")
    version = out.strip().splitlines()[-1]
    assert version.split("+")[0] == pinned_version(read_constraints(REPO), "torch")
    assert version.endswith("+cpu")


def test_image_layout_and_labels(built: BuildResult) -> None:
    out = _run(
        built.name,
        "sh",
        "-c",
        "test -f /opt/elastrain/examples/mnist_elastic.py && echo examples-ok; "
        "stat -c '%a %n' /home /var/log/jobs /etc/mpi; echo PATH=$PATH; "
        "echo env=$PYTHONUNBUFFERED$ELASTRAIN_IMAGE; pwd; "
        "ls -d /wheels /dist /root/.cache 2>/dev/null; "
        "find / -xdev \\( -name 'torch-*.whl' -o -name 'elastrain-*.whl' \\) -print",
    )
    assert "examples-ok" in out
    assert "1777 /home" in out and "1777 /var/log/jobs" in out and " /etc/mpi" in out
    assert "PATH=/opt/elastrain/venv/bin:" in out
    assert "env=11" in out
    assert "\n/\n" in out  # WORKDIR /
    assert "/wheels" not in out and "/dist" not in out and "/root/.cache" not in out and ".whl" not in out
    labels, size = image_labels_and_size(built.name)
    assert labels["elastrain.image"] == "true"
    assert labels["elastrain.frameworks"] == "pytorch"
    assert labels["elastrain.framework"] == "pytorch"
    assert labels["elastrain.key"] == built.key
    assert labels["elastrain.torch"].startswith(pinned_version(read_constraints(REPO), "torch"))
    assert labels["elastrain.python"].startswith("3.")
    assert size == built.size_bytes > 0


def test_image_list_shows_it(built: BuildResult) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "elastrain", "image", "list", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows[built.name]["frameworks"] == ["pytorch"]
    assert rows[built.name]["key"] == built.key
    found = find_image(built.name.removeprefix("localhost/"))
    assert found is not None and found.key == built.key and found.frameworks == ("pytorch",)


def test_second_build_is_cached(built: BuildResult) -> None:
    again = build_image("pytorch", progress=lambda _line: None, repo_root=REPO)
    if again.key != built.key:
        pytest.skip("the sources changed while the test ran (a new image was built)")
    assert again.cached
    assert again.name == built.name and again.key == built.key
    assert again.seconds < 30


def test_image_holds_this_checkouts_code(built: BuildResult) -> None:
    """The installed package is the working tree's (a layer cache must never keep an earlier build)."""
    import hashlib

    site = "/opt/elastrain/venv/lib/python3.11/site-packages/elastrain"
    for rel in ("rendezvous/coordinator.py", "backends/container.py", "agent/noded.py"):
        inside = _run(built.name, "sha256sum", f"{site}/{rel}").split()[0]
        assert inside == hashlib.sha256((REPO / "elastrain" / rel).read_bytes()).hexdigest(), rel
