"""The pull commands' edges in-process: without huggingface_hub, one line that installs it; `--help` pointing at a
real model; `import` telling a path from a repo id."""
import sys

from support import run_main

from tinychat.hub import RECOMMENDED_NAME, RECOMMENDED_PULL


def test_without_huggingface_hub_pull_says_how_to_install_it(monkeypatch, capsys):
    for mod in [m for m in sys.modules if m == "huggingface_hub" or m.startswith("huggingface_hub.")]:
        monkeypatch.delitem(sys.modules, mod)
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)          # import huggingface_hub fails
    for args in (["pull", "org/model"], ["pull", "org/model", "--list"], ["pull", "org/model", "--offline"]):
        code, out, err = run_main(args, capsys)
        assert code == 2 and err == ("tinychat: error: this needs huggingface_hub, the Hugging Face client: "
                                     "pip install huggingface_hub\n"), err
    code, out, err = run_main(["models"], capsys)                       # the imported models still list
    assert code == 0 and "no imported models" in out


def test_help_says_the_shipped_model_is_a_demo_and_how_to_get_a_real_one(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    assert "The shipped model is a 21.7M-parameter demo" in out
    assert f"{RECOMMENDED_PULL} (then: tinychat -m {RECOMMENDED_NAME})" in out
    for flag, default in (("--temperature", "0.8"), ("--penalty-window", "64"), ("--no-parrot", "off"),
                          ("--max-new", "256")):
        line = next(ln for ln in out.splitlines() if flag in ln)
        assert f"Default: {default} (or the model's own" in line, line
    code, out, _ = run_main(["pull", "--help"], capsys)
    assert code == 0 and "HF_TOKEN" in out and "--offline" in out and "--list" in out


def test_import_of_a_missing_path_says_so_and_of_an_uncached_repo_how_to_pull_it(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in (tmp_path / "nothing.gguf", "models/nothing.gguf"):
        code, _, err = run_main(["import", path], capsys)
        assert code == 2 and err.strip().endswith("nothing.gguf: no such file or folder"), err
    code, _, err = run_main(["import", "org/model"], capsys)
    assert code == 2 and err == (f"tinychat: error: org/model: no such file or folder here, nor a repo in the "
                                 f"Hugging Face cache ({tmp_path / 'hf' / 'hub'}): tinychat pull org/model "
                                 f"downloads it\n")
    for empty in ("", "  "):        # not "." (the current folder): typer made a Path of it
        code, _, err = run_main(["import", empty], capsys)
        assert code == 2 and err.startswith("tinychat: error: SRC is empty"), err
