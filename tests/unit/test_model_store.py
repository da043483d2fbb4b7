"""Issue #33 item 9 and issue #28's `tinychat models rm NAME` / sizes on disk: one lock per model name
(importer/lock.py). A chat holds its model's lock shared; import and rm take it exclusively. Two imports of one name
both reported success and the slower deleted the faster's model; a killed import left a hidden `.NAME.importing`
(352 MB for SmolLM2) that nothing removed."""
import gc
import importlib.util
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support import run_main

from tinychat import paths
from tinychat.importer import import_model, list_models
from tinychat.importer import lock as L
from tinychat.importer import run as R
from tinychat.importer.store import remove_model
from tinychat.loading import LoadError, load_runtime

_spec = importlib.util.spec_from_file_location("_llama_writers", Path(__file__).with_name("test_llama_import.py"))
_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_llama)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def src(tmp_path):
    cfg = _llama._config("llama")
    return _llama.write_hf(tmp_path / "hf", cfg, _llama._weights(cfg))


def test_a_second_import_of_a_name_being_imported_is_refused_and_the_first_completes(src, monkeypatch):
    inside, go = threading.Event(), threading.Event()
    real = R._import

    def slow(*a, **k):
        inside.set()
        assert go.wait(60)
        return real(*a, **k)

    monkeypatch.setattr(R, "_import", slow)
    done = {}
    first = threading.Thread(target=lambda: done.setdefault("dest", import_model(src, name="twin")))
    first.start()
    assert inside.wait(60)
    monkeypatch.setattr(R, "_import", real)
    with pytest.raises(L.ModelBusy, match=f"model 'twin' is being imported by another tinychat \\(pid {os.getpid()}"):
        import_model(src, name="twin", force=True)
    go.set()
    first.join(60)
    assert done["dest"].is_dir() and [m["name"] for m in list_models()] == ["twin"]
    load_runtime(done["dest"])                            # the first import's model is whole


def test_an_import_in_another_process_refuses_a_second_one_in_one_line(src, capsys):
    folder = paths.models_dir()
    script = ("import sys, time; from tinychat.importer.lock import acquire; "
              "l = acquire(sys.argv[1], 'twin', shared=False, action='import'); print('held', flush=True); "
              "sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", script, str(folder)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == b"held"
        code, _, err = run_main(["import", src, "--name", "twin"], capsys)
        assert code == 2 and err.count("\n") == 1
        assert f"model 'twin' is being imported by another tinychat (pid {holder.pid})" in err
    finally:
        holder.stdin.close()
        holder.wait(60)
    code, _, err = run_main(["import", src, "--name", "twin"], capsys)      # free again once it exited
    assert code == 0, err


def test_rm_and_a_forced_import_are_refused_while_a_chat_holds_the_model(src, capsys):
    dest = import_model(src, name="held")
    rt = load_runtime(dest)
    code, _, err = run_main(["models", "rm", "held"], capsys)
    assert code == 2 and "model 'held' is open in a chat: close that chat first" in err and err.count("\n") == 1
    with pytest.raises(L.ModelBusy, match="open in a chat"):
        import_model(src, name="held", force=True)
    with pytest.raises(L.ModelBusy, match="open in a chat"):
        remove_model("held")
    assert (dest / "config.json").is_file()
    del rt
    gc.collect()                                         # the chat's model is gone: so is its lock
    code, _, err = run_main(["models", "rm", "held"], capsys)
    assert code == 0 and "deleted held" in err
    assert not dest.exists() and list_models() == [] and not (dest.parent / ".held.lock").exists()


def test_a_chat_cannot_open_a_model_while_it_is_being_imported(src):
    dest = import_model(src, name="busy")
    with L.acquire(dest.parent, "busy", shared=False, action="import"):
        with pytest.raises(LoadError, match="model 'busy' is being imported"):
            load_runtime(dest)
    load_runtime(dest)


def test_a_chat_in_another_process_keeps_its_model_from_rm(src, capsys):
    dest = import_model(src, name="inuse")
    chat = subprocess.Popen([sys.executable, "-m", "tinychat", "--model", "inuse", "--plain", "--json", "--max-new",
                             "3", "--seed", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        chat.stdin.write(b"hello\n")
        chat.stdin.flush()
        assert json.loads(chat.stdout.readline())["n_tokens"] >= 0          # the chat has its model open
        code, _, err = run_main(["models", "rm", "inuse"], capsys)
        assert code == 2 and "open in a chat" in err and dest.is_dir()
    finally:
        chat.stdin.close()
        chat.wait(60)
    code, _, err = run_main(["models", "rm", "inuse"], capsys)
    assert code == 0 and not dest.exists()


def test_leftovers_of_killed_imports_are_swept_unless_an_import_is_under_way(src, capsys):
    folder = paths.models_dir()
    folder.mkdir(parents=True)
    for name in ("dead", "alive"):
        left = folder / f".{name}.importing"
        left.mkdir()
        (left / "model.safetensors").write_bytes(b"\0" * 4096)
    (folder / ".gone.removing").mkdir()
    with L.acquire(folder, "alive", shared=False, action="import"):     # an import of "alive" is under way
        code, _, _ = run_main(["models"], capsys)
        assert code == 0
        assert not (folder / ".dead.importing").exists() and not (folder / ".gone.removing").exists()
        assert (folder / ".alive.importing").is_dir()
    import_model(src, name="other")                                     # an import sweeps too
    assert not (folder / ".alive.importing").exists()


def test_a_killed_import_leaves_nothing_the_next_listing_keeps(src, capsys):
    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from tinychat.importer import run as R; real = R.atomic_write\n"
        "def slow(*a, **k):\n    print('writing', flush=True); time.sleep(600)\n"
        "R.atomic_write = slow\nR.import_model(sys.argv[1], name='killed')"), str(src)],
        stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    try:
        assert proc.stdout.readline().strip() == b"writing"             # inside the import, its folder written
        assert (paths.models_dir() / ".killed.importing").is_dir()
    finally:
        proc.kill()
        proc.wait(60)
    code, out, _ = run_main(["models"], capsys)
    assert code == 0 and "no imported models" in out
    assert not (paths.models_dir() / ".killed.importing").exists()


def test_models_lists_the_size_on_disk_and_rm_refuses_what_is_not_a_model(src, capsys):
    import_model(src, name="sized")
    code, out, err = run_main(["models"], capsys)
    assert code == 0 and "on disk" in out and "1 model," in err
    [row] = json.loads(run_main(["models", "--json"], capsys)[1])
    assert row["disk_bytes"] >= row["bytes"] > 0
    for bad, words in (("nothere", "no imported model named 'nothere'"), ("../x", "model name")):
        code, _, err = run_main(["models", "rm", bad], capsys)
        assert code == 2 and words in err and err.count("\n") == 1


def test_a_lock_file_whose_holder_died_is_free():
    folder = paths.models_dir()
    p = subprocess.run([sys.executable, "-c", "import sys; from tinychat.importer.lock import acquire; "
                        "l = acquire(sys.argv[1], 'x', shared=False, action='import'); import os; os._exit(0)",
                        str(folder)], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert p.returncode == 0
    L.acquire(folder, "x", shared=False, action="rm", wait=0).release()     # no retry: held, it would refuse at once


def _lock_files() -> list[str]:
    return sorted(p.name for p in paths.models_dir().glob(".*.lock"))


def test_imports_done_or_refused_rm_listings_and_chats_leave_no_lock_file(src, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_main(["import", empty, "--name", "bad"], capsys)      # refused under the name's lock
    assert code == 2 and err.count("\n") == 1 and _lock_files() == []
    dest = import_model(src, name="kept")
    assert _lock_files() == []
    with L.acquire(dest.parent, "kept", shared=False, action="import"):
        with pytest.raises(L.ModelBusy, match="being imported"):          # refused: someone else holds it
            import_model(src, name="kept", force=True)
        assert _lock_files() == [".kept.lock"]                             # the holder's, while it holds it
    assert _lock_files() == []
    rt = load_runtime(dest)                                                # a chat holds it shared
    assert _lock_files() == [".kept.lock"]
    del rt
    gc.collect()
    assert _lock_files() == []
    (paths.models_dir() / ".gone.importing").mkdir()                      # a sweep locks the leftover's name
    assert run_main(["models"], capsys)[0] == 0 and _lock_files() == []
    assert run_main(["models", "rm", "kept"], capsys)[0] == 0 and _lock_files() == []


def test_a_chat_letting_go_never_removes_the_lock_another_chat_holds(src):
    dest = import_model(src, name="two")
    first, second = (L.acquire(dest.parent, "two", shared=True) for _ in range(2))
    first.release()
    assert (dest.parent / ".two.lock").is_file()
    with pytest.raises(L.ModelBusy, match="open in a chat"):               # the second chat still keeps imports out
        import_model(src, name="two", force=True)
    second.release()
    assert _lock_files() == []
    import_model(src, name="two", force=True)


def test_an_acquirer_that_opened_a_lock_file_just_before_its_removal_locks_the_new_one(monkeypatch):
    """The race the removal must not open: B opens the file, A (the holder) removes it and lets go, B's flock then
    succeeds on the removed file. B must notice and lock the file the path names now, or a third party could hold
    that one at the same time."""
    folder = paths.models_dir()
    a = L.acquire(folder, "race", shared=False, action="import")
    real_flock, removed = L.fcntl.flock, []

    def flock(fd, how):
        if not removed:                          # B's first flock: A lets go (removing the file) just before it
            removed.append(True)
            a.release()
        return real_flock(fd, how)

    monkeypatch.setattr(L.fcntl, "flock", flock)
    b = L.acquire(folder, "race", shared=False, action="import", wait=0)
    monkeypatch.setattr(L.fcntl, "flock", real_flock)
    now = os.stat(folder / ".race.lock")
    assert (os.fstat(b.fd).st_dev, os.fstat(b.fd).st_ino) == (now.st_dev, now.st_ino)
    with pytest.raises(L.ModelBusy):
        L.acquire(folder, "race", shared=False, action="rm", wait=0)
    b.release()
    assert _lock_files() == []
