from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# No per-example deadline: these machines are shared and noisy, and a slow example is not a wrong one.
settings.register_profile("tinychat", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("tinychat")

from support import make_model  # noqa: E402  after the hypothesis profile


@pytest.fixture
def tiny():
    return make_model()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))         # `tinychat models` lists this (empty) HF cache
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


@pytest.fixture(autouse=True)
def _no_leftover_kernel_notices():
    """nativebuild.NOTICES is process-wide (one CLI run, one list); a test that provokes a notice must not leave it
    for the next test's REPL to print."""
    yield
    from tinychat import nativebuild
    nativebuild.NOTICES.clear()


# The fast lane (`python -m pytest -m "not slow"`, the inner loop; CI runs everything): tests marked slow in their
# files, and those that tests/slow.txt lists, which tests/slow_list.py writes from a `--durations=0` run.
_SLOW_LIST = Path(__file__).with_name("slow.txt")


def pytest_collection_modifyitems(config, items):
    if not _SLOW_LIST.exists():
        return
    slow = {line.split("#")[0].strip() for line in _SLOW_LIST.read_text().splitlines()} - {""}
    for item in items:
        if item.nodeid in slow:
            item.add_marker(pytest.mark.slow)
