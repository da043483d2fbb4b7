"""What a non-editable install (`pip install .`, README's first command) carries: every file the package reads at
run time must match one of pyproject's package-data patterns, or the installed app fails on first use."""
from fnmatch import fnmatch
from pathlib import Path

import tomllib

from tinychat.engine import native

ROOT = Path(__file__).resolve().parents[2]


def _patterns() -> list[str]:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return cfg["tool"]["setuptools"]["package-data"]["tinychat"]


def test_every_kernel_source_the_engine_compiles_is_package_data():
    pats = _patterns()
    missing = [n for n in native.SOURCES if not any(fnmatch(f"engine/{n}", p) for p in pats)]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_every_non_python_file_in_the_engine_and_ui_is_package_data():
    pats = _patterns()
    pkg = ROOT / "tinychat"
    missing = []
    for sub in ("engine", "tui"):
        for f in (pkg / sub).rglob("*"):
            rel = f.relative_to(pkg).as_posix()
            if f.is_file() and f.suffix not in (".py", ".pyc") and "__pycache__" not in rel:
                if not any(fnmatch(rel, p) for p in pats):
                    missing.append(rel)
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
