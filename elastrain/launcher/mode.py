"""`elastrain run --mode auto`: does the training command use elastrain (native mode) or not (restart)?

Decided from the command's source, without importing or running anything. ``python script.py``,
``python -m module`` (found as Python would, from here) and ``python -c CODE``: native when that
source imports elastrain (``import elastrain``, ``from elastrain... import``) or Horovod's API
(``import horovod.torch as hvd``), restart mode when not (``elastrain.frameworks``, the helpers for
restart-mode scripts, and the reporting call alone, ``from elastrain import report`` or
``elastrain.reporting``, do not count).
Another program: its first existing ``.py`` argument decides (``deepspeed train.py``); without one, a
binary program (``echo``, ``bash -c ...``) is restart mode and a text one (a wrapper script) native.
When the source cannot be found (a wrapper, ``python -m`` of a module not found here, ``python -``)
the mode is native: an elastrain script run in restart mode would train alone, while a native job
whose workers exit 0 without joining it fails at once with a hint to use ``--mode restart`` (see
``elastrain/rendezvous/coordinator.py``).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

# elastrain, or Horovod's API (in elastrain's images `horovod` is elastrain's implementation of it)
# elastrain.frameworks: restart-mode helpers; elastrain.reporting: `report()`, usable from any script
_ELASTRAIN = r"(?:elastrain(?!\.frameworks\b|\.reporting\b)|horovod)"
# not `from elastrain import report` (alone, `as` a name or not)
_ONLY_REPORT = r"(?![ \t]+import[ \t]+report[ \t]*(?:as[ \t]+\w+[ \t]*)?(?:$|[;#]))"
_IMPORTS_ELASTRAIN = re.compile(
    rf"(?:^|;)[ \t]*(?:from[ \t]+{_ELASTRAIN}{_ONLY_REPORT}[\s.]"  # from elastrain(.y) import x
    rf"|import[ \t]+(?:[\w.]+[ \t]*(?:as[ \t]+\w+)?[ \t]*,[ \t]*)*{_ELASTRAIN}\b)",  # import a, elastrain
    re.M,
)


def python_target(command: list[str]) -> tuple[str, str] | None:
    """What ``python [options] ...`` runs: ("code", CODE), ("module", NAME), ("script", PATH) or None."""
    args = command[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return ("script", args[i + 1]) if i + 1 < len(args) else None
        if arg == "-" or not arg.startswith("-"):
            return None if arg == "-" else ("script", arg)
        takes_next = False
        if not arg.startswith("--"):  # a cluster of short options: -u, -uB, -Wignore, -um mod, -c CODE
            for j in range(1, len(arg)):
                if arg[j] in "cm":
                    value = arg[j + 1 :] or (args[i + 1] if i + 1 < len(args) else None)
                    return None if value is None else ("code" if arg[j] == "c" else "module", value)
                if arg[j] in "WX":
                    takes_next = not arg[j + 1 :]
                    break
        i += 2 if takes_next else 1
    return None


def _module_file(name: str) -> Path | None:
    """The source file `python -m name` would run (from here), found without importing anything."""
    import importlib.machinery

    search: list[str] | None = [str(Path.cwd()), *sys.path]
    spec = None
    parts = name.split(".")
    for depth in range(len(parts)):
        fullname = ".".join(parts[: depth + 1])
        spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: python -m runs its __main__
        for location in spec.submodule_search_locations:
            if (Path(location) / "__main__.py").is_file():
                return Path(location) / "__main__.py"
        return None
    return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None


def _read(path: Path) -> str | None:
    try:
        if path.is_file() and path.stat().st_size < 4 << 20:
            return path.read_text(errors="replace")
    except OSError:
        pass
    return None


def uses_elastrain(command: list[str]) -> bool:
    """Auto-detect the mode: True (native) when `command` imports elastrain or its source cannot be
    found, False (restart mode) when its source does not import elastrain or it is a binary program."""
    if not command:
        return True
    if Path(command[0]).name.startswith("python"):
        target = python_target(command)
        if target is None:
            return True
        kind, value = target
        if kind == "code":
            return bool(_IMPORTS_ELASTRAIN.search(value))
        path = _module_file(value) if kind == "module" else Path(value)
        text = _read(path) if path is not None else None
        return True if text is None else bool(_IMPORTS_ELASTRAIN.search(text))
    script = next((Path(a) for a in command[1:] if a.endswith(".py") and Path(a).is_file()), None)
    if script is not None:
        return bool(_IMPORTS_ELASTRAIN.search(_read(script) or ""))
    program = shutil.which(command[0])
    text = _read(Path(program)) if program else None
    return text is not None and "\0" not in text[:4096]  # a binary program cannot import elastrain
