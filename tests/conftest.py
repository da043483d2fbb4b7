import pytest

from support import make_model


@pytest.fixture
def tiny():
    return make_model()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
