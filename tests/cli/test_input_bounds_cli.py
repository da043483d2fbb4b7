"""Issue #33 item 5, the input half: `tinychat -f /dev/zero` and `-p - </dev/zero` read until MemoryError, and a
30 MB -f file peaked at 5.2 GB in 41 s before "message too long" (the whole text was tokenized first). Input is now
read with a bound derived from the context (Chat.input_limit) and refused in one line before it is tokenized."""
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tc(*args, stdin=None, input=None, timeout=120):
    t = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "tinychat", *map(str, args)], stdin=stdin, input=input,
                       capture_output=True, timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace"), time.monotonic() - t


def _one_error_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("tinychat: error: ") and "Traceback" not in err


def test_a_message_file_of_dev_zero_is_refused_in_one_line(model_dir):
    rc, out, err, dt = tc("--model", model_dir, "-f", "/dev/zero")
    assert rc == 2 and out == "" and _one_error_line(err) and dt < 100, err


def test_a_message_on_stdin_from_dev_zero_is_refused_in_one_line(model_dir):
    with open("/dev/zero", "rb") as zero:
        rc, out, err, dt = tc("--model", model_dir, "-p", "-", stdin=zero)
    assert rc == 2 and _one_error_line(err) and "too long" in err and dt < 100, err


def test_a_30_mb_message_file_is_refused_before_it_is_tokenized(model_dir, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("the cat sat on the mat. " * (30 * 2 ** 20 // 24))
    rc, out, err, dt = tc("--model", model_dir, "-f", big, "--max-new", "4")
    assert rc == 2 and _one_error_line(err) and "too long" in err and dt < 100, err


def test_plain_mode_skips_an_overlong_line_and_goes_on(model_dir):
    lines = b"x" * 2_000_000 + b"\nhello there\n"
    rc, out, err, dt = tc("--model", model_dir, "--plain", "--json", "--max-new", "4", "--seed", "1", input=lines)
    assert rc == 2 and "message too long" in err and "Traceback" not in err
    assert len(out.strip().splitlines()) == 1 and '"n_tokens"' in out           # the second line was answered


def test_plain_mode_on_dev_zero_stops_reading_in_one_error(model_dir):
    with open("/dev/zero", "rb") as zero:
        rc, out, err, dt = tc("--model", model_dir, "--plain", stdin=zero)
    assert rc == 2 and "endless line" in err and "Traceback" not in err and dt < 100, err
