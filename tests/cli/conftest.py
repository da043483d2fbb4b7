"""Shared fixtures of the CLI tests."""
import pytest
from support import make_chat_model, tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The tiny chat model and its tokenizer, saved as a model folder."""
    d = tmp_path_factory.mktemp("model")
    make_chat_model().save_pretrained(d)
    tokenizer().save(d / "tokenizer.json")
    return d


@pytest.fixture(scope="session")
def _built_kernels(tmp_path_factory):
    """Native kernels any CLI test of the run built, kept for the tests after it."""
    return tmp_path_factory.mktemp("built-kernels")


@pytest.fixture(autouse=True)
def _shared_kernel_builds(_isolated_home, _built_kernels):
    """Each test's TINYCHAT_HOME is new, and the tinychat processes a test starts load the native kernels (the
    default --quant auto): without this each of those tests compiled them again (~3 s of CPU). Copies (not links:
    a test may damage its own), taken at the start and given back at the end."""
    import os
    import shutil
    from pathlib import Path
    kernels = Path(os.environ["TINYCHAT_HOME"]) / "cache" / "kernels"
    built = [f for f in _built_kernels.iterdir() if f.is_file()]
    if built:
        kernels.mkdir(parents=True, exist_ok=True)
        for f in built:
            shutil.copy2(f, kernels / f.name)
    yield
    if kernels.is_dir():
        for f in kernels.iterdir():
            if f.is_file() and not f.name.startswith(".") and not (_built_kernels / f.name).exists():
                shutil.copy2(f, _built_kernels / f.name)
