"""Issue #33 item 5, the input half: `tinychat -f /dev/zero` and `-p - </dev/zero` read until MemoryError, and a
30 MB -f file peaked at 5.2 GB in 41 s before "message too long" (the whole text was tokenized first). Input is now
read with a bound derived from the context (Chat.input_limit) and refused in one line before it is tokenized.

What bounds the work here is the child's peak memory (its own rusage, from wait4), not a clock: reading /dev/zero or
tokenizing 30 MB took gigabytes, a refusal takes what loading the model does (about 0.3 GB)."""
import os
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PEAK_BYTES = 2 ** 30        # a refusal's peak: ~0.3 GB now (the model, torch); reading or tokenizing all took 5+ GB


def tc(*args, stdin=None, input=None, timeout=120):
    """(exit code, stdout, stderr, peak resident bytes) of `tinychat ARGS`."""
    p = subprocess.Popen([sys.executable, "-m", "tinychat", *map(str, args)], cwd=REPO,
                         stdin=subprocess.PIPE if input is not None else stdin, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(REPO)})
    got: dict = {}

    def feed():
        try:
            p.stdin.write(input)
            p.stdin.close()
        except BrokenPipeError:
            pass
    readers = [threading.Thread(target=lambda k=k, f=f: got.__setitem__(k, f.read()))
               for k, f in (("out", p.stdout), ("err", p.stderr))]
    readers += [threading.Thread(target=feed)] if input is not None else []
    for r in readers:
        r.start()
    killer = threading.Timer(timeout, p.kill)       # a hang fails the test (killed: no exit 2), not the run
    killer.start()
    _, status, usage = os.wait4(p.pid, 0)           # the child's own rusage (not every child's, as getrusage gives)
    killer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    for r in readers:
        r.join()
    return (p.returncode, got["out"].decode(errors="replace"), got["err"].decode(errors="replace"),
            usage.ru_maxrss * 1024)


def _one_error_line(err: str) -> bool:
    lines = err.strip().splitlines()
    return len(lines) == 1 and lines[0].startswith("tinychat: error: ") and "Traceback" not in err


def test_a_message_file_of_dev_zero_is_refused_in_one_line(model_dir):
    rc, out, err, peak = tc("--model", model_dir, "-f", "/dev/zero")
    assert rc == 2 and out == "" and _one_error_line(err) and peak < PEAK_BYTES, (err, peak)


def test_a_message_on_stdin_from_dev_zero_is_refused_in_one_line(model_dir):
    with open("/dev/zero", "rb") as zero:
        rc, out, err, peak = tc("--model", model_dir, "-p", "-", stdin=zero)
    assert rc == 2 and _one_error_line(err) and "too long" in err and peak < PEAK_BYTES, (err, peak)


def test_a_30_mb_message_file_is_refused_before_it_is_tokenized(model_dir, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("the cat sat on the mat. " * (30 * 2 ** 20 // 24))
    rc, out, err, peak = tc("--model", model_dir, "-f", big, "--max-new", "4")
    assert rc == 2 and _one_error_line(err) and "too long" in err and peak < PEAK_BYTES, (err, peak)


def test_plain_mode_skips_an_overlong_line_and_goes_on(model_dir):
    lines = b"x" * 2_000_000 + b"\nhello there\n"
    rc, out, err, peak = tc("--model", model_dir, "--plain", "--json", "--max-new", "4", "--seed", "1", input=lines)
    assert rc == 2 and "message too long" in err and "Traceback" not in err and peak < PEAK_BYTES, (err, peak)
    assert len(out.strip().splitlines()) == 1 and '"n_tokens"' in out           # the second line was answered


def test_plain_mode_on_dev_zero_stops_reading_in_one_error(model_dir):
    with open("/dev/zero", "rb") as zero:
        rc, out, err, peak = tc("--model", model_dir, "--plain", stdin=zero)
    assert rc == 2 and "endless line" in err and "Traceback" not in err and peak < PEAK_BYTES, (err, peak)
