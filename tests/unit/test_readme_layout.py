"""README's layout section names every module of the package (top level and engine/) and nothing that is gone."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _layout() -> str:
    text = ROOT.joinpath("README.md").read_text(encoding="utf-8")
    m = re.search(r"^## Layout\n(.*?)^## ", text, re.S | re.M)
    assert m, "README has no Layout section"
    return m.group(1)


def test_readme_layout_names_every_module():
    layout = _layout()
    named = set(re.findall(r"([a-z0-9_]+\.py)\b", layout))
    for folder in ("tinychat", "tinychat/engine", "tinychat/chat", "tinychat/sessions"):
        have = {p.name for p in ROOT.joinpath(folder).glob("*.py") if not p.name.startswith("__")}
        assert have - named == set(), f"{folder}: not in README's layout"


def test_readme_layout_names_only_what_exists():
    layout = _layout()
    top = {p.name for p in ROOT.joinpath("tinychat").glob("*.py")}
    engine = {p.name for p in ROOT.joinpath("tinychat/engine").glob("*.py")}
    tui = {p.name for p in ROOT.joinpath("tinychat/tui").glob("*.py")}
    training = {p.name for p in ROOT.joinpath("tinychat/training").glob("*.py")}
    packages = {p.name for d in ("chat", "sessions", "hub", "importer") for p in ROOT.joinpath("tinychat", d).glob("*.py")}
    docs = {p.name for p in ROOT.joinpath("docs").glob("*")} | {p.name for p in ROOT.joinpath("tests/unit").glob("*")}
    named = set(re.findall(r"([a-z0-9_]+\.(?:py|md))\b", layout)) - {"README.md", "MODEL_CARD.md"}
    assert named - top - engine - tui - training - packages - docs == set()
    for folder in re.findall(r"^\s{4}(\S+/)\s", layout, re.M):
        assert ROOT.joinpath(folder).is_dir(), folder
