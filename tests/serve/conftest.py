"""The serve tests' fixtures: the tiny chat model as a model folder, and live servers (uvicorn on a free loopback
port, in a thread, every wait bounded)."""
import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from serve_support import runner_for, start  # noqa: E402
from support import make_chat_model, tokenizer  # noqa: E402


@pytest.fixture(scope="package")
def model_dir(tmp_path_factory):
    """The tiny chat model and its tokenizer, saved as a model folder (what `--model` and replay load)."""
    d = tmp_path_factory.mktemp("tiny-model")
    make_chat_model().save_pretrained(d)
    tokenizer().save(d / "tokenizer.json")
    return d


@pytest.fixture(scope="package")
def home(tmp_path_factory):
    """TINYCHAT_HOME for what the package-scoped fixtures load (the identity cache), never the user's."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TINYCHAT_HOME", str(tmp_path_factory.mktemp("serve-home")))
    yield
    mp.undo()


@pytest.fixture(scope="package")
def server(model_dir, home):
    """The shared server: default limits, no key."""
    s = start(runner_for(model_dir))
    yield s
    s.close()


@pytest.fixture(scope="package")
def model_id(server):
    return server.app.state.runner.model_id
