"""tinychat/nativebuild.py: the shared C build helper of the decode kernels and the training attention kernel."""
import ctypes

import pytest

from tinychat import nativebuild as NB

SRC = "int tc_answer(void) { return 42; }\n"


@pytest.fixture
def cc():
    c = NB.compiler()
    if c is None:
        pytest.skip("no C compiler here")
    return c


def test_builds_once_then_reuses_the_cached_object(cc, tmp_path):
    so = NB.build_shared(SRC, "answer", [["-O2"]], cc=cc, dirs=[tmp_path])
    assert so.parent == tmp_path and so.name.startswith("answer_") and ctypes.CDLL(str(so)).tc_answer() == 42
    stamp = so.stat().st_mtime_ns
    assert NB.build_shared(SRC, "answer", [["-O2"]], cc=cc, dirs=[tmp_path]) == so
    assert so.stat().st_mtime_ns == stamp
    other = NB.build_shared(SRC, "answer", [["-O2"]], cc=cc, dirs=[tmp_path], key_extra=("v2",))
    assert other != so and other.is_file()                       # a new key part: a new object
    # each object beside the record of its size and sha256; no temp files left
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [so.name, so.name + ".sha256", other.name, other.name + ".sha256"])


def test_a_damaged_cached_object_is_built_again(cc, tmp_path):
    so = NB.build_shared(SRC, "answer", [["-O2"]], cc=cc, dirs=[tmp_path])
    size = so.stat().st_size
    with open(so, "r+b") as f:
        f.truncate(100)                  # a full disk, a killed copy: dlopen of this would die with SIGBUS
    assert NB.build_shared(SRC, "answer", [["-O2"]], cc=cc, dirs=[tmp_path]) == so
    assert so.stat().st_size == size and ctypes.CDLL(str(so)).tc_answer() == 42


def test_falls_back_to_the_next_flag_set_and_reports_a_failed_build(cc, tmp_path):
    so = NB.build_shared(SRC, "answer", [["-fno-such-flag-here"], ["-O1"]], cc=cc, dirs=[tmp_path])
    assert ctypes.CDLL(str(so)).tc_answer() == 42
    with pytest.raises(NB.BuildError, match="compiling broken failed"):
        NB.build_shared("int f(void) { return }\n", "broken", [["-O1"]], cc=cc, dirs=[tmp_path])


def test_cache_dir_follows_tinychat_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path))
    assert NB.cache_dir() == tmp_path / "cache" / "kernels"
