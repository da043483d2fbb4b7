"""Issue #33 item 2, through a real terminal: a reply holding `ESC ] 0 ; PWNED BEL` set the terminal's title through
--plain, -p and /alt, and `tinychat import` / `tinychat models` printed a source path raw (an OSC sequence in a file
name reached the terminal). Every command that prints something a file, a model or a user supplied is run here with
its stdout and stderr on a pseudo-terminal, and what reaches that terminal must hold no OSC sequence, no BEL, no C1
control and no bidi override: the planted text shows as visible escapes (\\x1b) instead. The terminal formatting
tinychat itself prints (rich's colours: CSI ... m) is allowed.

The model is rigged (tests/support's tiny model with its layers zeroed and its embedding / head set up as a chain) so
that every reply it gives is exactly the planted text, token by token."""
import json
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import make_chat_model, tokenizer

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = "\x1b]0;PWNED\x07"
SHOWN = "\\x1b]0;PWNED\\x07"                     # what the terminal must show instead
FORBIDDEN = re.compile(rb"\x1b\]|\x07|\x1bP|\xc2[\x80-\x9f]|\xe2\x80[\xaa-\xae]|\xe2\x81[\xa6-\xa9]")


@pytest.fixture(scope="module")
def rigged(tmp_path_factory):
    """A model folder whose every reply is PAYLOAD (then the stop token)."""
    tok = tokenizer()
    seq = tok.encode(PAYLOAD)
    chain = [tok.generation_prompt_ids()[-1], *seq, tok.im_end]
    assert len(set(chain)) == len(chain) <= 64
    m = make_chat_model()
    d = m.cfg.d_model
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.w_o.weight.zero_()
            blk.mlp.down.weight.zero_()
            if blk.engram is not None:
                blk.engram.w_v.weight.zero_()
        m.head.weight.zero_()
        for k, (a, b) in enumerate(zip(chain, chain[1:])):     # the hidden state is embed[a]: make it pick b
            e = torch.zeros(d)
            e[k] = 1.0
            m.embed.weight[a] = e
            m.head.weight[b] += 50 * e
    folder = tmp_path_factory.mktemp("rigged")
    m.save_pretrained(folder)
    tok.save(folder / "tokenizer.json")
    return folder


def on_tty(*args, typed: bytes | None = None, piped: bytes | None = None, timeout: float = 120,
           home: Path | None = None) -> bytes:
    """Run `tinychat ARGS` with stdout and stderr on a pseudo-terminal (stdin too when `typed`, else a pipe holding
    `piped`); everything the terminal received. home: its TINYCHAT_HOME (default: the test's)."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "COLUMNS": "120", "LINES": "40"}
    if home is not None:
        env["TINYCHAT_HOME"] = str(home)
    p = subprocess.Popen([sys.executable, "-m", "tinychat", *map(str, args)], cwd=REPO, env=env,
                         stdin=slave if typed is not None else subprocess.PIPE, stdout=slave, stderr=slave)
    os.close(slave)
    if typed is not None:
        os.write(master, typed)
    else:
        p.stdin.write(piped or b"")
        p.stdin.close()
    out = b""
    while True:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:                  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        elif p.poll() is not None:
            break
    p.wait(timeout)
    os.close(master)
    return out


def _clean(out: bytes) -> bool:
    return FORBIDDEN.search(out) is None


REPLY = ["--temperature", "0", "--penalty", "1", "--no-ban", "--max-new", "20", "--seed", "1"]


def test_a_one_shot_reply_reaches_the_terminal_escaped(rigged):
    out = on_tty("--model", rigged, "-p", "hi", *REPLY)
    assert _clean(out), out
    assert SHOWN.encode() in out


def test_the_interactive_plain_mode_streams_replies_escaped_and_alt_undo_trace_too(rigged):
    typed = b"hi\r/regen\r/alt 1\r/trace on\rhello\r/undo\r/info\r/set\r/quit\r"
    out = on_tty("--model", rigged, "--plain", *REPLY, typed=typed)
    assert _clean(out), out
    assert out.count(SHOWN.encode()) >= 3              # the streamed replies and the /alt reprint


def test_the_piped_plain_mode_prints_replies_escaped_on_a_terminal(rigged):
    out = on_tty("--model", rigged, "--plain", *REPLY, piped=b"hi\n/regen\n/alt 1\n/ab temperature=0.5\n")
    assert _clean(out), out
    assert SHOWN.encode() in out


@pytest.fixture(scope="module")
def session(rigged, tmp_path_factory):
    """(id, TINYCHAT_HOME) of a saved session of the rigged model (its replies: the payload), with an evil title."""
    home = tmp_path_factory.mktemp("home")
    p = subprocess.run([sys.executable, "-m", "tinychat", "--model", str(rigged), "--plain", "--json", *REPLY],
                       input=b"hi\nagain\n", capture_output=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "TINYCHAT_HOME": str(home)}, timeout=120)
    assert p.returncode == 0, p.stderr
    [path] = (home / "sessions").glob("*.json")
    d = json.loads(path.read_text())
    d["title"] = f"title {PAYLOAD} \u202eevil"
    path.write_text(json.dumps(d))
    return d["id"], home


@pytest.mark.parametrize("args", [
    ["sessions"], ["sessions", "--grep", "PWNED"], ["sessions", "show", "{sid}"], ["sessions", "export", "{sid}"],
    ["sessions", "export", "{sid}", "--format", "json"], ["replay", "{sid}", "--model", "{model}"],
    ["replay", "{sid}", "--check", "--model", "{model}"], ["sessions", "copy", "{sid}", "--title", PAYLOAD],
    ["sessions", "show", PAYLOAD], ["sessions", "rename", "{sid}", PAYLOAD + "renamed"],
])
def test_every_session_command_prints_planted_text_escaped(rigged, session, args):
    sid, home = session
    argv = [a.replace("{sid}", sid).replace("{model}", str(rigged)) for a in args]
    out = on_tty(*argv, home=home)
    assert _clean(out), (argv, out)


def test_import_models_and_info_print_a_planted_path_escaped(rigged, tmp_path):
    import shutil
    src = tmp_path / f"evil{PAYLOAD}model"
    shutil.copytree(rigged, src)
    out = on_tty("info", "--model", src)
    assert _clean(out), out
    assert b"PWNED" in out
    weird = tmp_path / f"src{PAYLOAD}.gguf"
    weird.write_bytes(b"GGUF" + b"\0" * 64)             # refused, and the refusal names the path: escaped too
    out = on_tty("import", weird, "--name", "x")
    assert _clean(out), out
    models = Path(os.environ["TINYCHAT_HOME"]) / "models" / "planted"
    models.mkdir(parents=True)
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        shutil.copy(rigged / f, models / f)
    (models / "import.json").write_text(json.dumps({"source": f"/models/{PAYLOAD}", "params": 1}))
    out = on_tty("models")
    assert _clean(out), out
    assert b"planted" in out and b"\\x1b]0;PWNED" in out


def test_the_app_shows_a_planted_reply_as_control_pictures(rigged, session):
    """The app (Textual) draws control characters as their Unicode pictures (␛ ␇): checked on a real terminal."""
    import fcntl
    import struct
    import termios
    import time
    sid, home = session
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "TINYCHAT_HOME": str(home)}
    p = subprocess.Popen([sys.executable, "-m", "tinychat", "--model", str(rigged), "-s", sid], cwd=REPO, env=env,
                         stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    out, t0, quit_at = b"", time.monotonic(), None
    try:
        while time.monotonic() - t0 < 120 and p.poll() is None:
            if quit_at is None and b"PWNED" in out:
                os.write(master, b"\x11")              # Ctrl+Q
                quit_at = time.monotonic()
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    out += os.read(master, 1 << 16)
                except OSError:
                    break
    finally:
        if p.poll() is None:
            p.kill()
        p.wait(30)
        os.close(master)
    text = re.sub(rb"\x1b\[[0-9;?<>=$]*[a-zA-Z~]", b"", out).decode(errors="replace")
    assert b"PWNED" in out, text[-2000:]
    assert b"\x1b]0;PWNED" not in out and "␛]0;PWNED".encode() in out


def test_pull_list_prints_a_repo_s_planted_file_names_escaped(capsys):
    """A repo's file names are someone else's text (the Hub's listing, or a Hugging Face cache folder): `tinychat pull
    ORG/NAME --list` printed them raw."""
    from types import SimpleNamespace

    from tinychat import cli_models
    from tinychat.hub.ref import gguf_choices
    sizes = {f"x{PAYLOAD}-Q8_0.gguf": 10, f"x{PAYLOAD}-Q4_K_M.gguf": 5, "README.md": 1}
    choices = gguf_choices(sizes)
    ref = SimpleNamespace(repo="org/evil", quant=None)
    cli_models._list_pull(SimpleNamespace(kind="gguf", ref=ref, commit="c" * 40, offline=True, choices=choices,
                                          choice=choices[0]))
    cli_models._list_pull(SimpleNamespace(kind="safetensors", ref=ref, commit="c" * 40, offline=False,
                                          files=[f"config{PAYLOAD}.json"], sizes={"model.safetensors": 3}))
    out = capsys.readouterr().out
    assert _clean(out.encode()) and out.count(SHOWN) == 3, out
