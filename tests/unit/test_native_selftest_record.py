"""The native kernels' self-test runs once per build, not once per process: a pass is recorded beside the object
(engine/native.py: _self_tested), and anything the pass depends on that changes runs it again."""
from tinychat.engine import native


def _object(tmp_path, record="120768 abc"):
    so = tmp_path / "tc_native_x.so"
    so.write_bytes(b"\x7fELF")
    so.with_name(so.name + ".sha256").write_text(record + "\n", encoding="ascii")
    return so


def _counting(monkeypatch, result=True):
    runs = []
    monkeypatch.setattr(native, "_self_test", lambda lib: runs.append(lib) or result)
    return runs


def test_a_passed_self_test_is_recorded_and_not_run_again_for_the_same_object(tmp_path, monkeypatch):
    so, runs = _object(tmp_path), _counting(monkeypatch)
    assert native._self_tested("lib", so) and len(runs) == 1
    assert (tmp_path / "tc_native_x.so.selftest").is_file()
    assert native._self_tested("lib", so) and len(runs) == 1         # the record: no second run


def test_another_build_of_the_object_runs_the_self_test_again(tmp_path, monkeypatch):
    so, runs = _object(tmp_path), _counting(monkeypatch)
    native._self_tested("lib", so)
    _object(tmp_path, record="120800 def")                            # rebuilt: another size and sha256
    assert native._self_tested("lib", so) and len(runs) == 2


def test_a_changed_or_damaged_record_runs_the_self_test_again(tmp_path, monkeypatch):
    so, runs = _object(tmp_path), _counting(monkeypatch)
    native._self_tested("lib", so)
    mark = tmp_path / "tc_native_x.so.selftest"
    mark.write_text(mark.read_text(encoding="ascii").replace(str(native.ABI), "0"), encoding="ascii")
    assert native._self_tested("lib", so) and len(runs) == 2
    mark.write_bytes(b"\xff\xfe")
    assert native._self_tested("lib", so) and len(runs) == 3


def test_a_failed_self_test_is_not_recorded(tmp_path, monkeypatch):
    so, runs = _object(tmp_path), _counting(monkeypatch, result=False)
    assert not native._self_tested("lib", so) and not native._self_tested("lib", so) and len(runs) == 2
    assert not (tmp_path / "tc_native_x.so.selftest").exists()


def test_without_the_build_record_the_self_test_runs_every_time(tmp_path, monkeypatch):
    so, runs = _object(tmp_path), _counting(monkeypatch)
    so.with_name(so.name + ".sha256").unlink()
    assert native._self_tested("lib", so) and native._self_tested("lib", so) and len(runs) == 2
