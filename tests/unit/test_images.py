"""elastrain.images without podman: cache keys, name normalisation, the catalog, refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from elastrain.cli.main import main
from elastrain.errors import ConfigError
from elastrain.images import build, catalog, keys, recipe, rootfs

REPO = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- keys


def test_rootfs_key_is_stable_and_sensitive() -> None:
    k = keys.rootfs_key("bookworm", "minbase", ["python3", "less"], ["path-exclude=/usr/share/man/*"])
    assert len(k) == keys.KEY_LEN
    assert k == keys.rootfs_key("bookworm", "minbase", ["less", "python3"], ["path-exclude=/usr/share/man/*"])
    assert k != keys.rootfs_key("trixie", "minbase", ["python3", "less"], ["path-exclude=/usr/share/man/*"])
    assert k != keys.rootfs_key("bookworm", "minbase", ["python3"], ["path-exclude=/usr/share/man/*"])
    assert k != keys.rootfs_key("bookworm", "minbase", ["python3", "less"], [])


def test_base_key_covers_constraints_requirements_and_rootfs() -> None:
    reqs = ["numpy>=1.24", "torch==2.13.0"]
    k = keys.base_key("1", "r" * 12, "torch==2.13.0\n", reqs)
    assert k == keys.base_key("1", "r" * 12, "torch==2.13.0\n", list(reversed(reqs)))
    assert k != keys.base_key("1", "r" * 12, "torch==2.14.0\n", reqs)
    assert k != keys.base_key("1", "r" * 12, "torch==2.13.0\n", [*reqs, "scipy"])
    assert k != keys.base_key("1", "s" * 12, "torch==2.13.0\n", reqs)
    assert k != keys.base_key("2", "r" * 12, "torch==2.13.0\n", reqs)
    assert k != keys.base_key("1", "r" * 12, "torch==2.13.0\n", reqs, ["torch-2.13.0+cpu.whl"])


def test_final_key_covers_base_and_sources() -> None:
    k = keys.final_key("b" * 12, "s" * 12, "pytorch")
    assert k == keys.final_key("b" * 12, "s" * 12, "pytorch")
    assert k != keys.final_key("c" * 12, "s" * 12, "pytorch")
    assert k != keys.final_key("b" * 12, "t" * 12, "pytorch")


def _mini_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "elastrain" / "sub").mkdir(parents=True)
    (root / "examples").mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "elastrain"\nversion = "0.1.0"\n')
    (root / "README.md").write_text("readme\n")
    (root / "elastrain" / "__init__.py").write_text("x = 1\n")
    (root / "elastrain" / "sub" / "mod.py").write_text("y = 2\n")
    (root / "examples" / "train.py").write_text("print('hi')\n")
    return root


def test_source_hash_follows_content_not_mtime_or_artefacts(tmp_path: Path) -> None:
    root = _mini_repo(tmp_path)
    files = keys.source_files(root)
    assert files == [
        "README.md",
        "elastrain/__init__.py",
        "elastrain/sub/mod.py",
        "examples/train.py",
        "pyproject.toml",
    ]
    h = keys.source_hash(root)
    assert h == keys.source_hash(root)
    # touching, bytecode, caches and build output change nothing
    (root / "elastrain" / "sub" / "mod.py").touch()
    (root / "elastrain" / "__pycache__").mkdir()
    (root / "elastrain" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (root / "elastrain" / "sub" / "stale.pyc").write_bytes(b"\0")
    (root / "elastrain.egg-info").mkdir()
    (root / "elastrain.egg-info" / "PKG-INFO").write_text("x")
    assert keys.source_hash(root) == h
    # an edit, a new module, an example or the metadata do
    (root / "elastrain" / "sub" / "mod.py").write_text("y = 3\n")
    h2 = keys.source_hash(root)
    assert h2 != h
    (root / "elastrain" / "new.py").write_text("")
    h3 = keys.source_hash(root)
    assert h3 != h2
    (root / "examples" / "train.py").write_text("print('bye')\n")
    assert keys.source_hash(root) != h3
    h4 = keys.source_hash(root)
    (root / "pyproject.toml").write_text('[project]\nname = "elastrain"\nversion = "0.2.0"\n')
    assert keys.source_hash(root) != h4


def test_source_files_of_this_repo_hold_the_package_not_artefacts() -> None:
    files = keys.source_files(REPO)
    assert "pyproject.toml" in files
    assert "elastrain/images/keys.py" in files
    assert "examples/mnist_elastic.py" in files
    assert not [f for f in files if f.endswith(".pyc") or "__pycache__" in f or ".egg-info" in f]
    assert keys.source_hash(REPO, files) == keys.source_hash(REPO, files)


# ---------------------------------------------------------------- recipe


def test_requirements_take_the_torch_pin_from_constraints(tmp_path: Path) -> None:
    root = tmp_path / "r"
    root.mkdir()
    (root / "pyproject.toml").write_text(
        '[project]\nname = "elastrain"\nversion = "0.1.0"\ndependencies = ["torch>=2", "numpy"]\n'
        '[project.optional-dependencies]\nexamples = ["scipy>=1.10"]\n'
    )
    (root / "constraints.txt").write_text("# pin\ntorch==9.8.7\n")
    (root / "pyproject.toml").write_text(
        (root / "pyproject.toml").read_text()
        + 'server = ["httpx"]\ndeepspeed = ["deepspeed>=0.16"]\nnotebook = ["jupyterlab>=4"]\n'
        + 'tensorboard = ["tensorboard"]\n'
    )
    reqs = recipe.requirements(root)
    assert reqs == [
        "torch>=2", "numpy", "scipy>=1.10", "httpx", "jupyterlab>=4", "tensorboard", "torch==9.8.7"
    ]  # fmt: skip
    assert recipe.extra_requirements(root, ("deepspeed",)) == ["deepspeed>=0.16"]
    with pytest.raises(ConfigError, match="no optional-dependencies extra 'gpu'"):
        recipe.extra_requirements(root, ("gpu",))
    (root / "constraints.txt").write_text("numpy<3\n")
    with pytest.raises(ConfigError, match="pins no torch"):
        recipe.requirements(root)


def test_this_repos_requirements_hold_torch_pin_and_examples() -> None:
    reqs = recipe.requirements(REPO)
    pin = recipe.pinned_version(recipe.read_constraints(REPO), "torch")
    assert f"torch=={pin}" in reqs
    assert any(r.startswith("mnist1d") for r in reqs)


def test_build_refuses_frameworks_it_cannot_build_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_podman(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("podman must not run for a refused framework")

    monkeypatch.setattr(build, "podman", no_podman)
    can = r"can build: deepspeed, horovod, megatron, pytorch, slurm"
    for name in ("tensorflow", "jax"):
        with pytest.raises(ConfigError, match=can) as info:
            build.build_image(name, progress=lambda _line: None)
        assert repr(name) in str(info.value)
    # a framework elastrain knows of but cannot build says why (none is listed today)
    assert recipe.UNAVAILABLE_FRAMEWORKS == {}
    monkeypatch.setitem(recipe.UNAVAILABLE_FRAMEWORKS, "tensorflow", "out of scope (see the README)")
    with pytest.raises(ConfigError, match=rf"'tensorflow': out of scope \(see the README\); {can}"):
        build.build_image("tensorflow", progress=lambda _line: None)


def test_cli_image_build_refusal_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["image", "build", "--framework", "tensorflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert "can build: deepspeed, horovod, megatron, pytorch, slurm" in err


def test_missing_mmdebstrap_names_the_package(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(ConfigError, match=r"apt-get install mmdebstrap"):
        rootfs.mmdebstrap_argv("bookworm", "minbase", ["python3"], [], tmp_path / "x.tar", [])


def test_host_mirror_entries_read_deb822_and_one_line(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# comment\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main\n\n"
        "Types: deb\nURIs: http://other.example/x\nSuites: nodistro\nComponents: main\n"
    )
    (tmp_path / "sources.list").write_text(
        "deb [arch=amd64] http://sec.example/debian-security bookworm-security main # c\n"
        "deb http://mirror.example/debian trixie main\n"
    )
    (tmp_path / "sources.list.d" / "x.list.disabled").write_text("deb http://no.example bookworm main\n")
    entries = rootfs.host_mirror_entries("bookworm", apt_dir=tmp_path)
    keyring = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    assert entries == [
        "deb [arch=amd64] http://sec.example/debian-security bookworm-security main",
        f"deb {keyring} http://mirror.example/debian bookworm main",
        f"deb {keyring} http://mirror.example/debian bookworm-updates main",
    ]


# ---------------------------------------------------------------- catalog

_ID_NEW = "a" * 64
_ID_OLD = "b" * 64
_LABELS = {"elastrain.image": "true", "elastrain.frameworks": "pytorch", "elastrain.key": "k"}
_PODMAN_IMAGES = [
    # podman 4.3 repeats an image once per tag
    {"Id": _ID_NEW, "Names": ["localhost/elastrain-pytorch:new", "localhost/elastrain-pytorch:latest"]}
    | {"Labels": _LABELS, "Size": 1_400_000_000, "Created": 1_700_000_100},
    {"Id": _ID_NEW, "Names": ["localhost/elastrain-pytorch:new", "localhost/elastrain-pytorch:latest"]}
    | {"Labels": _LABELS, "Size": 1_400_000_000, "Created": 1_700_000_100},
    {"Id": _ID_OLD, "Names": ["localhost/elastrain-pytorch:old"], "Labels": _LABELS}
    | {"Size": 1_300_000_000, "Created": 1_700_000_000},
    {"Id": "c" * 64, "Names": ["localhost/other:1"], "Labels": None, "Size": 1, "Created": 1},
]


@pytest.fixture
def fake_podman(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    calls: list[tuple[str, ...]] = []

    def podman_json(*args: str, timeout: float = 60.0) -> Any:
        calls.append(args)
        return _PODMAN_IMAGES

    monkeypatch.setattr(catalog, "podman_json", podman_json)
    return calls


def test_list_images_one_entry_per_tag(fake_podman: list[tuple[str, ...]]) -> None:
    images = catalog.list_images()
    assert [i.name for i in images] == [
        "localhost/elastrain-pytorch:old",
        "localhost/elastrain-pytorch:latest",
        "localhost/elastrain-pytorch:new",
    ]
    assert fake_podman[0][:3] == ("images", "--filter", "label=elastrain.image=true")
    latest = images[1]
    assert latest.frameworks == ("pytorch",)
    assert latest.created == "2023-11-14T22:15:00Z"
    assert latest.size_bytes == 1_400_000_000
    assert latest.id == _ID_NEW
    assert latest.key == "k"


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("elastrain-pytorch", "localhost/elastrain-pytorch:latest"),
        ("elastrain-pytorch:latest", "localhost/elastrain-pytorch:latest"),
        ("localhost/elastrain-pytorch:latest", "localhost/elastrain-pytorch:latest"),
        (" elastrain-pytorch:old ", "localhost/elastrain-pytorch:old"),
        ("team/img", "localhost/team/img:latest"),
        ("quay.io/team/img:2", "quay.io/team/img:2"),
        ("registry:5000/img", "registry:5000/img:latest"),
    ],
)
def test_normalize_name(given: str, normal: str) -> None:
    assert catalog.normalize_name(given) == normal


def test_find_image_accepts_short_and_full_names(fake_podman: list[tuple[str, ...]]) -> None:
    for name in ("elastrain-pytorch", "elastrain-pytorch:latest", "localhost/elastrain-pytorch:latest"):
        found = catalog.find_image(name)
        assert found is not None and found.name == "localhost/elastrain-pytorch:latest", name
        assert found.id == _ID_NEW
    old = catalog.find_image("elastrain-pytorch:old")
    assert old is not None and old.id == _ID_OLD
    by_id = catalog.find_image(_ID_OLD[:12])
    assert by_id is not None and by_id.id == _ID_OLD
    assert catalog.find_image("elastrain-horovod") is None
    assert catalog.find_image("other:1") is None  # not an elastrain image


def test_default_image_for_is_the_newest_latest(fake_podman: list[tuple[str, ...]]) -> None:
    img = catalog.default_image_for("pytorch")
    assert img is not None and img.name == "localhost/elastrain-pytorch:latest"
    assert catalog.default_image_for("horovod") is None


def test_framework_images_names_the_repo_build_makes() -> None:
    assert {
        name: f"localhost/elastrain-{name}"
        for name in ("pytorch", "horovod", "deepspeed", "slurm", "megatron")
    } == catalog.FRAMEWORK_IMAGES


def test_a_framework_no_image_holds_is_refused_with_the_build_command(
    fake_podman: list[tuple[str, ...]], tmp_path: Path
) -> None:
    from elastrain.backends.container import ContainerBackend

    backend = ContainerBackend(tmp_path / "data")
    with pytest.raises(ValueError, match=r"no image holds framework 'horovod'") as refused:
        backend.resolve_image("", "horovod")
    assert "elastrain image build --framework horovod" in str(refused.value)
    with pytest.raises(ValueError, match=r"holds pytorch, not deepspeed; build one with"):
        backend.resolve_image("elastrain-pytorch", "deepspeed")
    assert backend.resolve_image("", "pytorch") == "localhost/elastrain-pytorch:latest"


def test_a_newer_image_that_also_holds_the_framework_does_not_shadow_its_own() -> None:
    def info(name: str, frameworks: tuple[str, ...], created: str, ident: str) -> catalog.ImageInfo:
        return catalog.ImageInfo(name, frameworks, 1, created, "k", ident * 64)

    pytorch = info("localhost/elastrain-pytorch:latest", ("pytorch",), "2026-12-01T10:00:00Z", "a")
    slurm = info("localhost/elastrain-slurm:latest", ("slurm", "pytorch"), "2026-12-01T11:00:00Z", "b")
    custom = info("localhost/team/torch:latest", ("pytorch",), "2026-12-01T12:00:00Z", "c")
    assert catalog.pick_default([pytorch, slurm, custom], "pytorch") == pytorch
    assert catalog.pick_default([slurm, custom], "pytorch") == custom  # no own image: the newest
    assert catalog.pick_default([pytorch, slurm], "slurm") == slurm
    assert catalog.pick_default([pytorch], "horovod") is None
