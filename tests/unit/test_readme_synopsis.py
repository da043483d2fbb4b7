"""README's command synopsis is generated from the CLI's parameters (docs/synopsis.py) and must match them: a flag
added, renamed or removed in cli.py fails here until `python docs/synopsis.py --write` is run."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _synopsis_module():
    spec = importlib.util.spec_from_file_location("synopsis", ROOT / "docs" / "synopsis.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_synopsis_is_what_the_cli_takes():
    syn = _synopsis_module()
    copy = syn.readme_copy((ROOT / "README.md").read_text(encoding="utf-8"))
    assert copy is not None, "README.md lost its synopsis markers"
    assert copy == syn.synopsis(), "README's synopsis is stale: run python docs/synopsis.py --write"


def test_the_synopsis_names_every_flag_of_every_command():
    import typer.main

    from tinychat.cli import app
    text = _synopsis_module().synopsis()
    chat = typer.main.get_command(app)
    flags = [o for p in chat.params for o in p.opts if o.startswith("--") and o != "--help"]
    assert "--threads" in flags and all(f in text for f in flags)
    assert "tinychat sessions export ID|PATH [-f, --format md|json] [-o, --out PATH]" in text


def test_every_command_of_the_synopsis_is_described_in_the_readme():
    syn = _synopsis_module()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    prose = readme.split(syn.END, 1)[1]
    for path, _cmd in syn._commands():
        name = " ".join(path)
        short = " ".join(path[1:])
        assert f"`{name}" in prose or (short and f"`{short}" in prose), f"{name}: not described in README"
