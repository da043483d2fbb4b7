"""Issue #33 item 3: `sessions export --out PATH` replaced what was at PATH (atomic_write renames a temp file over
it): a symlink became a file (its target untouched), a FIFO or a device node a regular file. fsutil.write_out leaves
what is there what it is: a link is followed, a FIFO or a character device written through, a folder or a block
device refused."""
import os
import stat
import threading

import pytest
from support import make_chat, run_main

from tinychat.fsutil import OutPathError, write_out


@pytest.fixture
def sid():
    chat = make_chat(max_new=4, seed=1)
    chat.send("hello there")
    chat.close()
    return chat.session.id


def test_export_through_a_symlink_writes_its_target_and_keeps_the_link(sid, tmp_path, capsys):
    target, link = tmp_path / "notes.md", tmp_path / "link.md"
    target.write_text("old")
    link.symlink_to(target)
    code, _, err = run_main(["sessions", "export", sid, "--out", link], capsys)
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "hello there" in target.read_text()


def test_export_to_a_dangling_link_creates_its_target(sid, tmp_path, capsys):
    link = tmp_path / "link.md"
    link.symlink_to(tmp_path / "new.md")
    code, _, err = run_main(["sessions", "export", sid, "--out", link, "--format", "json"], capsys)
    assert code == 0, err
    assert link.is_symlink() and '"hello there"' in (tmp_path / "new.md").read_text()


def test_export_to_a_fifo_writes_through_it_and_the_fifo_stays(sid, tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    code, _, err = run_main(["sessions", "export", sid, "--out", fifo], capsys)
    reader.join(30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and b"hello there" in got[0]


def test_a_device_node_is_written_through_and_stays_a_device(tmp_path):
    null = tmp_path / "null"
    try:
        os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))     # a /dev/null of our own (root only)
    except (PermissionError, OSError):
        null = "/dev/null"
        if not os.access(null, os.W_OK):
            pytest.skip("no device node to write to")
    write_out(null, b"x" * 100)
    assert stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_folder_or_a_missing_folder_is_refused_in_one_line(sid, tmp_path, capsys):
    code, _, err = run_main(["sessions", "export", sid, "--out", tmp_path], capsys)
    assert code == 2 and "a folder" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(OutPathError, match="no folder"):
        write_out(tmp_path / "nope" / "x.md", b"x")


def test_a_regular_file_is_still_replaced_atomically(tmp_path):
    f = tmp_path / "a.md"
    f.write_text("old")
    assert write_out(f, b"new") == f and f.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["a.md"]          # no temp file left


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_export_through_a_link_or_onto_a_file_keeps_the_file_s_mode(sid, tmp_path, capsys, mode):
    out = tmp_path / "out"
    out.mkdir()
    target, link = out / "notes.md", out / "link.md"
    target.write_text("old")
    target.chmod(mode)
    link.symlink_to(target)
    code, _, err = run_main(["sessions", "export", sid, "--out", link], capsys)
    assert code == 0, err
    assert "hello there" in target.read_text() and stat.S_IMODE(target.stat().st_mode) == mode
    target.chmod(mode ^ 0o020)
    write_out(target, b"again")                                      # named directly, not through a link
    assert target.read_bytes() == b"again" and stat.S_IMODE(target.stat().st_mode) == mode ^ 0o020
    assert sorted(p.name for p in out.iterdir()) == ["link.md", "notes.md"]          # no temp file left
