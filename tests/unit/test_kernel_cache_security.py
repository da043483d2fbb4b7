"""Issue #33 item 1: a planted kernel library. When the kernel cache folder could not be made (a read-only
TINYCHAT_HOME, or $TINYCHAT_HOME/cache being a file), build_shared fell back to $TMPDIR/tinychat-kernels: a shared
folder, a predictable name (tc_native_<key>.so, the key computable by anyone), and the only check a .sha256 record
that whoever plants the library writes too. A constructor in a planted library ran as the user. Code is now only
loaded from a folder no other user can write; else built into a fresh private temporary folder, with a notice."""
import ctypes
import os
import stat

import pytest

from tinychat import nativebuild as NB

SRC = "int tc_answer(void) { return 42; }\n"
EVIL = ('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {\n'
        '  FILE *f = fopen("%s", "w"); if (f) { fputs("pwned", f); fclose(f); } }\n'
        'int tc_answer(void) { return 666; }\n')


@pytest.fixture
def cc():
    c = NB.compiler()
    if c is None:
        pytest.skip("no C compiler here")
    return c


def _plant(cc, folder, tmp_path, name="answer"):
    """What an attacker does: build a library with a constructor under the name build_shared will look for, with a
    matching .sha256 record beside it. Returns the marker file its constructor writes."""
    marker = tmp_path / "pwned"
    folder.mkdir(parents=True, exist_ok=True)
    key = NB.build_key(SRC, cc)
    so = folder / f"{name}_{key}{NB.SUFFIX}"
    src = tmp_path / "evil.c"
    src.write_text(EVIL % marker)
    assert os.system(f"{cc} -shared -fPIC -o {so} {src}") == 0
    NB._write_stamp(so, NB._stamp(so))
    return marker


def _load(so) -> int:
    lib = ctypes.CDLL(str(so))
    lib.tc_answer.restype = ctypes.c_int
    return lib.tc_answer()


def test_a_library_planted_in_the_shared_temp_folder_is_never_loaded(cc, tmp_path, monkeypatch):
    home, shared_tmp = tmp_path / "home", tmp_path / "tmp"
    home.mkdir()
    (home / "cache").write_text("a file where the cache folder should be")
    shared_tmp.mkdir(mode=0o777)
    os.chmod(shared_tmp, 0o1777)                                    # like /tmp
    monkeypatch.setenv("TINYCHAT_HOME", str(home))
    monkeypatch.setenv("TMPDIR", str(shared_tmp))
    monkeypatch.setattr(NB.tempfile, "tempdir", None)               # TMPDIR read again
    marker = _plant(cc, shared_tmp / "tinychat-kernels", tmp_path)
    before = len(NB.NOTICES)
    so = NB.build_shared(SRC, "answer", [["-O1"]], cc=cc)
    assert _load(so) == 42 and not marker.exists()
    assert so.parent != shared_tmp / "tinychat-kernels" and stat.S_IMODE(os.stat(so.parent).st_mode) == 0o700
    assert len(NB.NOTICES) == before + 1 and "built for this run only" in NB.NOTICES[-1]
    assert "\n" not in NB.NOTICES[-1]


def test_a_cache_folder_under_a_folder_others_may_write_is_not_trusted(cc, tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)                                         # writable by all, not sticky
    cache = shared / "kernels"
    marker = _plant(cc, cache, tmp_path)
    os.chmod(cache, 0o700)
    assert "writable by others" in NB.private_problem(cache)
    so = NB.build_shared(SRC, "answer", [["-O1"]], cc=cc, dirs=[cache])
    assert _load(so) == 42 and not marker.exists() and so.parent != cache


def test_a_cache_folder_or_object_of_another_user_is_not_trusted(cc, tmp_path):
    cache = tmp_path / "kernels"
    marker = _plant(cc, cache, tmp_path)
    try:
        os.chown(cache, 12345, -1)
    except PermissionError:
        pytest.skip("changing a folder's owner needs root")
    assert "belongs to another user" in NB.private_problem(cache)
    so = NB.build_shared(SRC, "answer", [["-O1"]], cc=cc, dirs=[cache])
    assert _load(so) == 42 and not marker.exists()
    os.chown(cache, os.getuid(), -1)                               # the folder is ours again, the object is not
    key = NB.build_key(SRC, cc)
    planted = cache / f"answer_{key}{NB.SUFFIX}"
    os.chown(planted, 12345, -1)
    assert not NB._cached_ok(planted)
    so = NB.build_shared(SRC, "answer", [["-O1"]], cc=cc, dirs=[cache])
    assert so == planted and os.stat(so).st_uid == os.getuid() and _load(so) == 42


def test_our_own_cache_folder_made_group_writable_is_made_private_and_used(cc, tmp_path):
    cache = tmp_path / "kernels"
    cache.mkdir()
    os.chmod(cache, 0o775)                                          # a umask of 002
    so = NB.build_shared(SRC, "answer", [["-O1"]], cc=cc, dirs=[cache])
    assert so.parent == cache and stat.S_IMODE(os.stat(cache).st_mode) == 0o755 and _load(so) == 42
    os.chmod(so, 0o777)                                             # an object others may write is built again
    assert not NB._cached_ok(so)
