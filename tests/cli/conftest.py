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
