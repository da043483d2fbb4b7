"""The `tinychat` command. Thin: parses flags and hands over to the chat runtime, the app or the benchmark.
torch, the engine and Textual are imported inside the commands, so `tinychat --help` is instant."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from .choices import QUANT_CHOICES, QUANT_MODES, SIZES
from .errors import TinychatError
from .hub import RECOMMENDED, RECOMMENDED_NAME
from .loading import (check_choice, check_threads, load_model_for, load_runtime, model_for_session, model_path,
                      open_chat, open_replay_chat, resolve_device, resolve_quant, session_model)

HELP = """Chat with a small local TinyAgentLM model in the terminal.

With no command, opens the chat app (a line mode with --plain, or when piped: each input line is one turn).
Every chat is saved as a session; `tinychat sessions` lists them and `--session ID` continues one.

The shipped model is a 21.7M-parameter demo: fluent, not a source of facts. A real one in one command:
tinychat pull {RECOMMENDED} (then: tinychat -m {RECOMMENDED_NAME}).

Examples:  tinychat -p "Why is the sky blue?"  ·  echo "Hi!" | tinychat --plain --json  ·  tinychat replay ID --check

Errors print one line and exit 2 (70: a bug in tinychat, please report it); --debug shows the traceback.""".format(RECOMMENDED=RECOMMENDED,
                                                                          RECOMMENDED_NAME=RECOMMENDED_NAME)

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode="rich", help=HELP,
                  context_settings={"help_option_names": ["-h", "--help"]})

class UsageError(TinychatError):
    """A bad flag or argument: one line on stderr, exit 2."""


_QUANTS = "|".join(QUANT_CHOICES)
MODEL_HELP = "Model folder, or the name of an imported model (default: the shipped model)."


def _d(text: str, key: str) -> str:
    """A sampler flag's help with its default: tinychat's value, which a model's sampler.json may change."""
    from .settings import ChatSettings
    v = getattr(ChatSettings(), key)
    v = ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
    return f"{text} Default: {v} (or the model's own: tinychat info -m NAME)."


def _model_arg(value: Optional[Path]) -> Optional[Path]:
    """--model: a folder, or the name of a model imported with `tinychat import` (an existing path wins)."""
    return model_path(value)


def _debug() -> bool:
    return bool(os.environ.get("TINYCHAT_DEBUG"))


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def _progress(title: str):
    """A long command's progress: a transient line on stderr (spinner, what runs now, a bar where the total is known,
    the time so far) while stderr is a terminal; None otherwise (pipes and logs get the results only). Yields
    update(done, total, what) and, as the second item, echo(line) for stdout lines printed meanwhile (above the bar
    when stdout is the same terminal)."""
    if not _stderr_is_terminal():
        yield None, typer.echo
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from .textsafe import safe_line
    title = escape(safe_line(title))        # a file name: no escape sequence, no markup reaches the terminal
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True, redirect_stdout=False,
                  redirect_stderr=False) as bar:
        task = bar.add_task(title, total=None)

        def update(done: int, total: int, what: str) -> None:
            bar.update(task, completed=done, total=total or None, description=f"{title}: {escape(safe_line(what))}")

        def echo(line: str) -> None:
            if sys.stdout.isatty():
                bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
            else:
                typer.echo(line)
        yield update, echo


@app.callback(invoke_without_command=True)
def chat(ctx: typer.Context,
         model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
         quant: str = typer.Option("auto", "--quant", "-q", metavar=_QUANTS, help="Weights: auto (the int8 fast step where its "
                                   "native kernels build, full precision on a GPU or without them; a continued "
                                   "session keeps its own), none (fp32: the reference), int8, int4 (4-bit weights in groups of 32, int8 head) or bf16."),
         device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda", help="auto, cpu or cuda."),
         seed: Optional[int] = typer.Option(None, "--seed", metavar="N", help="Sampling seed for every turn (default: random, recorded)."),
         temperature: Optional[float] = typer.Option(None, "--temperature", "-t", metavar="F", help=_d("Sampling temperature (0: greedy).", "temperature")),
         top_p: Optional[float] = typer.Option(None, "--top-p", metavar="F", help=_d("Nucleus mass.", "top_p")),
         penalty: Optional[float] = typer.Option(None, "--penalty", metavar="F", help=_d("Repetition penalty (1: off).", "penalty")),
         penalty_window: Optional[int] = typer.Option(None, "--penalty-window", metavar="N", help=_d("The penalty covers the last this-many content tokens.", "penalty_window")),
         ban: Optional[bool] = typer.Option(None, "--ban/--no-ban", help=_d("Ban 3-grams the assistant already said in earlier turns.", "ban")),
         no_parrot: Optional[bool] = typer.Option(None, "--no-parrot/--parrot", help=_d("Also ban the 3-grams of the user's message (the reply does not parrot it).", "no_parrot")),
         ban_reply: Optional[bool] = typer.Option(None, "--ban-reply/--no-ban-reply",
                                                  help=_d("Also ban 3-grams the reply itself already said (no loops).", "ban_reply")),
         system: Optional[str] = typer.Option(None, "--system", metavar="TEXT", help="System prompt for a new chat (default: the model's chat template's, else \"You are a helpful assistant.\"; \"\": none)."),
         max_new: Optional[int] = typer.Option(None, "--max-new", metavar="N", help=_d("Most tokens per reply.", "max_new")),
         session: Optional[str] = typer.Option(None, "--session", "-s", metavar="ID", help="Continue a saved session (id, its unique start, or path), on the imported model it was recorded with unless --model is given."),
         continue_: bool = typer.Option(False, "--continue", "-c", help="Continue the most recent session (as --session with its id)."),
         save: Optional[bool] = typer.Option(None, "--save/--no-save", help="Save the chat as a session (default: yes; for -p / -f as the save_one_shots preference says, yes unless set). --no-save writes nothing."),
         plain: bool = typer.Option(False, "--plain", help="Line mode instead of the app (automatic when piped)."),
         json_out: bool = typer.Option(False, "--json", help="With --plain: one JSON object per reply on stdout."),
         prompt: Optional[str] = typer.Option(None, "--prompt", "-p", metavar="TEXT",
                                              help="One-shot: send TEXT as one message (- reads it all from stdin), "
                                                   "print the reply and exit (--json as in plain mode)."),
         prompt_file: Optional[Path] = typer.Option(None, "--file", "-f", metavar="FILE",
                                                    help="One-shot like -p, the message read from FILE (UTF-8)."),
         threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads (default: torch's, one per core; the int8 step then uses fewer while that measures faster, e.g. when other programs keep a core busy). A number given here is used as is."),
         ):
    """Chat with a small local TinyAgentLM model.

    Opens the app in a terminal; with --plain, or when stdin/stdout is not a terminal, a line mode where each
    input line is one turn. Every chat is saved as a session (see `tinychat sessions`)."""
    if ctx.invoked_subcommand is not None:
        return
    check_choice("--quant", quant, QUANT_CHOICES)
    if json_out and not plain and prompt is None and sys.stdin.isatty() and sys.stdout.isatty():
        raise UsageError("--json goes with --plain or -p")
    if prompt is not None and prompt_file is not None:
        raise UsageError("give the message with -p or with -f, not both")
    reader = None                           # -p / -f: read once the context is known (it bounds what is read)
    if prompt is not None or prompt_file is not None:
        reader = _message_reader(prompt, prompt_file)
        plain = True
    from .settings import ChatSettings
    overrides = {k: v for k, v in dict(seed=seed, temperature=temperature, top_p=top_p, penalty=penalty,
                                       penalty_window=penalty_window, ban=ban, no_parrot=no_parrot,
                                       ban_reply=ban_reply, system_prompt=system, max_new=max_new).items() if v is not None}
    ChatSettings(**overrides)       # a bad value stops here, before the model loads
    settings = None                 # tinychat's defaults < the model's < the session's < these overrides (open_chat)
    interactive = sys.stdin.isatty() and sys.stdout.isatty()
    session, autosave = _session_and_saving(session, continue_, save, one_shot=reader is not None,
                                            app=not plain and interactive)
    dev = resolve_device(device, resolve=plain or not interactive)
    tune = {}
    if check_threads(threads) is not None:
        import torch
        torch.set_num_threads(threads)
        tune = {"tune_threads": False}     # an explicit count is used as given (no thread tuning)
    from .options import EngineOptions
    options = EngineOptions.from_env(**tune)
    if session is not None:
        model = model_for_session(model, session)
    if not plain and interactive:   # torch and the model load on the app's worker, behind the window
        from .tui.app import run_app
        raise typer.Exit(run_app(model=model, quant=quant, device=dev, settings=settings, overrides=overrides,
                                 session=session, options=options, autosave=autosave))
    mode, why = resolve_quant(quant, dev, _session_for_auto(quant, session))
    rt = load_runtime(model, mode)
    chat_ = open_chat(rt, mode, dev, settings, overrides, session, options, quant_why=why, autosave=autosave)
    from .plain import PlainREPL

    def restore(ref):
        return open_chat(rt, mode, dev, None, {}, ref, options, quant_why=why, autosave=autosave)

    repl = PlainREPL(chat_, json_out=json_out, restore=restore)
    if reader is None:
        raise typer.Exit(repl.run())
    from .textin import lf
    prompt = lf(reader(chat_.input_limit()))   # CRLF / CR line breaks as LF, as everywhere text comes in
    repl.interactive = False                # one reply on stdout, notices on stderr
    r = repl.turn(lambda on_token, on_reply: chat_.send(prompt, on_token=on_token, on_reply=on_reply))
    raise typer.Exit(0 if r is not None and not repl.errors else 2)


def _session_and_saving(session: str | None, continue_: bool, save: bool | None, one_shot: bool, app: bool):
    """(the session to continue or None, whether to save): -c is the most recent session; the app opens it too when
    the reopen_last preference is on (and no session was named); --save / --no-save, else for one-shots (-p, -f)
    the save_one_shots preference, else save."""
    from .loading import latest_session
    from .prefs import load_prefs
    prefs, why = load_prefs()
    if why:
        print(f"tinychat: note: {why}", file=sys.stderr)
    if continue_:
        if session is not None:
            raise UsageError("give -c (the most recent session) or --session ID, not both")
        session = latest_session()
        if session is None:
            raise UsageError("-c: no saved session to continue yet (every chat is saved; `tinychat sessions` lists "
                             "them)")
    elif session is None and app and prefs.reopen_last:
        session = latest_session()
    autosave = save if save is not None else (prefs.save_one_shots if one_shot else True)
    return session, autosave


def _session_for_auto(quant: str, ref: str | None):
    """The session --quant auto continues (it keeps the session's mode), or None. A ref that does not load is left
    to open_chat's own load to report."""
    if quant != "auto" or ref is None:
        return None
    from .sessions import session as session_files
    try:
        return session_files.load(ref)
    except session_files.SessionError:
        return None


def _message_reader(prompt: str | None, path: Path | None):
    """-p TEXT, -p - (all of stdin) or -f FILE (UTF-8): checks what it can now (the file opens, stdin is not a
    terminal, the text is not empty) and returns read(limit) -> the message, which reads at most `limit` characters
    (Chat.input_limit: more cannot fit the context): `-f /dev/zero` or `-p - </dev/zero` are refused in one line
    instead of read until memory runs out."""
    if path is not None:
        try:
            f = open(path, "rb")
        except IsADirectoryError:
            raise UsageError(f"-f {path}: a folder, not a file") from None
        except OSError as e:
            raise UsageError(f"-f {path}: {e.strerror or e}") from None
        return lambda limit: _file_text(path, f, limit)
    if prompt == "-":
        if sys.stdin.isatty():
            raise UsageError("-p - reads the message from stdin, which is a terminal here: pipe the text in")
        return lambda limit: _checked_text(sys.stdin.read(limit + 1), "-p -: the message on stdin", limit)
    if not prompt.strip():
        raise UsageError("-p: the message is empty")
    return lambda limit: _checked_text(prompt, "-p: the message", limit)


def _checked_text(text: str, what: str, limit: int) -> str:
    if len(text) > limit:
        raise UsageError(f"{what} is too long: more than {limit:,} characters cannot fit the model's context")
    if not text.strip():
        raise UsageError(f"{what} is empty")
    return text


def _file_text(path: Path, f, limit: int) -> str:
    """-f's message: the file as UTF-8 text (one message), at most `limit` characters (4 bytes each at most)."""
    with f:
        try:
            data = f.read(4 * limit + 1)
        except OSError as e:
            raise UsageError(f"-f {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        if len(data) <= 4 * limit or e.start < len(data) - 4:
            raise UsageError(f"-f {path}: not UTF-8 text (byte {e.start})") from None
        text = data[:e.start].decode("utf-8", "replace") + "?"      # cut inside a character: too long anyway
    if "\0" in text:
        raise UsageError(f"-f {path}: a binary file (it holds NUL bytes)")
    return _checked_text(text, f"-f {path}", limit)


def _int8_kernels() -> str:
    """The int8 kernel path this machine runs (engine/native.py: e.g. avx512-vnni, avx2-vnni, neon-dotprod; "pytorch"
    where the native kernels are off), with why when off."""
    from .engine import native
    path = native.kernel_path()
    return path if native.why_not is None else f"{path} ({native.why_not})"


def _int8_step() -> str:
    """The int8 step as sessions recorded here name it (Chat.step_name without the prefill's part): the native
    step's version on this kernel path, or the PyTorch fallback; replay compares it with a session's."""
    from .engine import native
    from .plan import step_name
    if native.load() is None:
        return step_name(False, None, None, None)
    return step_name(True, None, native.step_version(), native.kernel_path())


PREFILL_KERNELS = {"native-gemm": "native int8 GEMM", "bf16-gemm": "bf16 GEMMs", "fp32-gemm": "fp32 GEMMs",
                   "int8-gemv": "int8 GEMV"}


def _int8_prefill() -> str:
    """What an int8 model's long prefill runs on here (Int8Linear.prefill_kernel at 256 rows, the engine options from
    the environment): the native int8 GEMM, or bf16 GEMMs (AMX machines, TINYCHAT_PREFILL_BF16=1, no kernels on a
    CPU with bf16 dot products), or fp32 GEMMs."""
    import torch

    from .engine.quant import Int8Linear
    from .options import EngineOptions
    o = EngineOptions.from_env()
    lin = Int8Linear(torch.nn.Linear(64, 64, bias=False), prefill_bf16=o.prefill_bf16, native=o.native)
    return PREFILL_KERNELS[lin.prefill_kernel(256)]


@app.command()
def info(model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
         config: Optional[str] = typer.Option(None, "--config", metavar="tiny|demo|full", help="A named size with random weights: tiny, demo, full."),
         json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Model summary: parameters, layers, and the KV-cache size per token next to a standard GQA cache."""
    m, desc = load_model_for(model, config)
    c = m.cfg
    family = "TinyAgentLM" if c.is_tinyagent else "llama family"
    from .quant_files import param_counts
    counts = param_counts(m)                    # a stored-quantized model's packed weights counted too
    facts = {
        "model": desc, "family": family, "stored": getattr(m, "stored_quant", None), "params": counts[0], "linear_params": counts[1],
        "vocab_size": c.vocab_size, "d_model": c.d_model, "n_layers": c.n_layers, "n_heads": c.n_heads,
        "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "kv_group": c.kv_group, "swa_window": c.swa_window,
        "max_seq_len": c.max_seq_len, "engram_layers": list(c.engram_layers), "engram_orders": list(c.engram_orders),
        "kv_bytes_per_token": c.kv_bytes_per_token(2), "gqa_kv_bytes_per_token": c.gqa_kv_bytes_per_token(2),
        "ring_bytes": c.ring_bytes(2),
        "int8_kernels": _int8_kernels(), "int8_prefill": _int8_prefill(), "int8_step": _int8_step(),
        **_sampler_facts(model, config),
    }
    from .loading import auto_quant
    facts["quant_auto"], facts["quant_auto_why"] = auto_quant(resolve_device("auto"))
    if json_out:
        import json
        typer.echo(json.dumps(facts))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.markup import escape

    from .textsafe import safe_line
    t = Table(title=escape(safe_line(f"{family} — {desc}")), show_header=False)     # a path: no markup, no escapes
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_row("weights", f"stored {facts['stored']} (packed in the file)" if facts["stored"] else "full precision")
    t.add_row("parameters", f"{facts['params'] / 1e6:.2f} M")
    t.add_row("Linear parameters", f"{facts['linear_params'] / 1e6:.2f} M")
    t.add_row("layers / groups", f"{c.n_layers} / {c.n_groups} (kv_group {c.kv_group})")
    t.add_row("heads / kv heads / head dim", f"{c.n_heads} / {c.n_kv_heads} / {c.head_dim}")
    t.add_row("d_model / mlp", f"{c.d_model} / {c.mlp_hidden}")
    t.add_row("vocab / context", f"{c.vocab_size} / {c.max_seq_len}")
    t.add_row("local window", f"{c.swa_window}")
    t.add_row("Engram", f"layers {list(c.engram_layers)}, orders {list(c.engram_orders)}" if c.has_engram else "none")
    t.add_row("--quant auto (the default)", escape(safe_line(f"{facts['quant_auto']}: {facts['quant_auto_why']}")))
    t.add_row("int8 kernels (--quant int8)", escape(safe_line(facts["int8_kernels"])))
    t.add_row("int8 step (sessions record)", facts["int8_step"])
    t.add_row("int8 prefill", facts["int8_prefill"])
    t.add_row("KV bytes / token (bf16)", f"{facts['kv_bytes_per_token']:,}")
    t.add_row("standard GQA cache / token", f"{facts['gqa_kv_bytes_per_token']:,} "
              f"({facts['gqa_kv_bytes_per_token'] / facts['kv_bytes_per_token']:.1f}x)")
    t.add_row("fixed local rings", f"{facts['ring_bytes'] / 1024:,.0f} KiB")
    Console().print(t)
    s = Table(title="sampler defaults (flags and /set change them; a session keeps its own)")
    for col in ("setting", "value", "from"):
        s.add_column(col)
    for k, v in facts["sampler"].items():
        val = v["value"]
        val = ("on" if val else "off") if isinstance(val, bool) else "random" if val is None else f"{val:g}" \
            if isinstance(val, float) else str(val)
        s.add_row(k.replace("_", "-"), val, v["from"])
    for k, v in facts.get("sampler_unused", {}).items():
        s.add_row(k.replace("_", "-"), str(v), "recommended by the model; tinychat's sampler has no such knob")
    Console().print(s)


def _sampler_facts(model: Optional[Path], config: Optional[str]) -> dict:
    """{"sampler": {setting: {"value", "from"}}} a new chat on this model starts with (no flags), and what the model
    recommends that tinychat cannot use ("sampler_unused")."""
    from .loading import default_model_path, model_defaults
    from .sampler_defaults import FIELDS, ModelDefaults, resolve
    folder = model if model is not None else default_model_path() if config is None else None
    md = model_defaults(Path(folder)) if folder is not None else ModelDefaults()
    st, src = resolve(md)
    out = {"sampler": {k: {"value": getattr(st, k), "from": src[k]} for k in FIELDS}}
    if md.unused:
        out["sampler_unused"] = md.unused
    return out


sessions_app = typer.Typer(help="Saved chats: list (also plain `tinychat sessions`), show, export, rename, copy, rm.",
                           invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(sessions_app, name="sessions")

_JSON_OPT = typer.Option(False, "--json", help="A JSON list.")
_GREP_OPT = typer.Option(None, "--grep", metavar="TEXT",
                         help="Only sessions whose title or any message (every branch) contains TEXT "
                              "(case-insensitive).")


@sessions_app.callback(invoke_without_command=True)
def sessions_default(ctx: typer.Context, json_out: bool = _JSON_OPT, grep: Optional[str] = _GREP_OPT):
    """List saved sessions, newest first."""
    if ctx.invoked_subcommand is None:
        _list_sessions(json_out, grep)


@sessions_app.command("list")
def sessions_list(json_out: bool = _JSON_OPT, grep: Optional[str] = _GREP_OPT):
    """List saved sessions, newest first (what plain `tinychat sessions` prints)."""
    _list_sessions(json_out, grep)


def _list_sessions(json_out: bool, grep: Optional[str]) -> None:
    import json
    import time

    from .sessions import session as session_files
    errors: list = []
    infos = session_files.list_sessions(errors=errors)
    if grep is not None:
        if not grep.strip():
            raise UsageError("--grep needs some text")
        infos = [i for i in infos if session_files.matches(i.path, grep)]
    if json_out:
        typer.echo(json.dumps([{"id": i.id, "path": str(i.path), "title": i.title, "updated": i.updated,
                                "n_turns": i.n_turns, "model": i.model} for i in infos]))
    else:
        for i in infos:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(i.updated))
            typer.echo(f"{i.id}  {when}  {i.n_turns:3d} {'turn ' if i.n_turns == 1 else 'turns'}  {i.title}"
                       f"  ({i.model or '?'})")
        if not infos:
            typer.echo("no saved sessions", err=True)
    for e in errors:
        from .textsafe import safe_line
        typer.echo(safe_line(f"skipped: {e}"), err=True)


@sessions_app.command("show")
def sessions_show(ref: str = typer.Argument(..., metavar="ID|PATH")):
    """Print a session as markdown."""
    from .sessions import session as session_files
    from .textsafe import safe_text
    from .sessions import export as session_export
    typer.echo(safe_text(session_export.export_markdown(session_files.load(ref))))


@sessions_app.command("export")
def sessions_export(ref: str = typer.Argument(..., metavar="ID|PATH"),
                    fmt: str = typer.Option("md", "--format", "-f", metavar="md|json", help="md or json."),
                    out: Optional[Path] = typer.Option(None, "--out", "-o", metavar="PATH", help="Write to a file (default: stdout).")):
    """Export a session as markdown or JSON."""
    from .sessions import session as session_files
    check_choice("--format", fmt, ("md", "json"))
    sess = session_files.load(ref)
    from .sessions import export as session_export
    text = session_export.export_markdown(sess) if fmt == "md" else session_export.export_json(sess)
    if out is None:
        from .textsafe import safe_text
        typer.echo(safe_text(text))
    else:
        from .fsutil import write_out
        from .textsafe import safe_line
        write_out(out, text.encode("utf-8"))       # a link is followed, a FIFO or a device written through
        typer.echo(safe_line(f"wrote {out}"), err=True)


@sessions_app.command("rename")
def sessions_rename(ref: str = typer.Argument(..., metavar="ID"), title: str = typer.Argument(...)):
    """Give a session a new title."""
    from .sessions import session as session_files
    session_files.rename(ref, title)


@sessions_app.command("copy")
def sessions_copy(ref: str = typer.Argument(..., metavar="ID"),
                  title: Optional[str] = typer.Option(None, "--title", metavar="TITLE", help="The copy's title (default: TITLE (copy))."),
                  json_out: bool = typer.Option(False, "--json", help="Print the copy's id and path as JSON.")):
    """Save a copy of a session under a new id (also while it is open elsewhere); continue it with -s NEW_ID."""
    import json

    from .sessions import session as session_files
    ref = session_files.resolve_id(ref)                     # the whole id, for the message below
    dup = session_files.copy(ref, title=title)
    path = session_files.session_path(dup.id)
    if json_out:
        typer.echo(json.dumps({"id": dup.id, "path": str(path), "title": dup.title}))
    else:
        typer.echo(dup.id)
        from .textsafe import safe_line
        typer.echo(safe_line(f"copied {ref} to {dup.id} ({dup.title}): continue it with `tinychat -s {dup.id}`"),
                   err=True)


@sessions_app.command("rm")
def sessions_rm(ref: str = typer.Argument(..., metavar="ID")):
    """Delete a session (and its KV snapshot)."""
    from .sessions import session as session_files
    sid = session_files.resolve_id(ref)
    if not session_files.delete(sid):
        raise UsageError(f"no session {ref!r} (`tinychat sessions` lists the saved ones)")
    typer.echo(f"deleted {sid}", err=True)


@app.command()
def replay(ref: str = typer.Argument(..., metavar="ID|PATH|DIR", help="A saved session, or a folder of them."),
           model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", callback=_model_arg,
                                                help="Model folder, or the name of an imported model (default: the "
                                                     "imported model the session was recorded with, else the "
                                                     "shipped model)."),
           check: bool = typer.Option(False, "--check", help="Only report: exit 0 token-exact, 1 on divergence."),
           json_out: bool = typer.Option(False, "--json", help="With a folder and --check: one JSON object per session."),
           play: bool = typer.Option(False, "--play", help="Play the session back in the app."),
           speed: float = typer.Option(1.0, "--speed", metavar="F", help="With --play: playback speed (0: as fast as it decodes)."),
           device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda", help="auto, cpu or cuda.")):
    """Regenerate every assistant turn of every branch with its recorded settings and seed; report the first token
    that differs. A folder (with --check) checks each session in it, one line per session.

    Exit 0 when every branch regenerates token-exact, 1 on a divergence (with the branch and token), 2 on any
    error."""
    from .sessions import session as session_files
    if not 0 <= speed < float("inf"):
        raise UsageError(f"--speed must be 0 (as fast as it decodes) or more (got {speed})")
    dev = resolve_device(device)
    if Path(ref).is_dir():
        if not check:
            raise UsageError("a folder of sessions is replayed with --check")
        from .chat.replay_check import check_folder
        runtimes: dict = {}           # each session on the model it names (--model: all on that one), loaded once

        def replay_chat(sess):
            m = model if model is not None else session_model(sess)     # (loading shows as the session's start)
            if m not in runtimes:
                runtimes[m] = load_runtime(m)
            return open_replay_chat(runtimes[m], sess, dev)
        with _progress("replay --check") as (progress, echo):
            code = check_folder(Path(ref), replay_chat, echo, json_out, progress)
        raise typer.Exit(code)
    if json_out:
        raise UsageError("--json goes with a folder and --check")
    sess = session_files.load(ref)
    model = model_for_session(model, ref)
    if play and sys.stdin.isatty() and sys.stdout.isatty():
        from .tui.app import run_replay
        raise typer.Exit(run_replay(sess, model=model, device=dev, speed=speed))
    from .chat.replay import replay_tree
    from .chat.replay_check import branch_lines
    many = bool(sess.branches)

    def on_turn(label, t):
        if not check:
            status = "exact" if t.divergence is None else "DIVERGES"
            typer.echo(f"{label + ': ' if many else ''}turn {t.turn}: {len(t.recorded)} tokens, {status}")

    # --check is silent until its report: say how far it is (loading a model and checking a session can take a
    # minute); without it each turn's line is the progress
    with _progress("replay --check") if check else contextlib.nullcontext((None, typer.echo)) as (progress, _):
        if progress is not None:
            progress(0, 0, "loading the model")
        chat_ = open_replay_chat(load_runtime(model), sess, dev)
        results = replay_tree(chat_, sess, on_turn=on_turn, progress=progress)
    from .textsafe import plural, safe_line
    if not many:                            # one path: the report as before
        report = results[0].report
        for d in report.divergences:
            typer.echo(safe_line(f"divergence: {d.describe()}"))
        for line in report.text_problems:
            typer.echo(safe_line(line))
        if report.step_note():
            typer.echo(safe_line(report.step_note()))
    else:
        for line in branch_lines(results):
            typer.echo(line)
    if all(b.report.ok for b in results):
        turns = sum(len(b.report.turns) for b in results)
        tokens = sum(b.report.n_tokens for b in results)
        where = f"{plural(len(results), 'branch', 'branches')}, " if many else ""
        typer.echo(f"replay: {where}{plural(turns, 'turn')}, {plural(tokens, 'token')}, token-exact")
        raise typer.Exit(0)
    raise typer.Exit(1)


@app.command()
def serve(model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
          quant: str = typer.Option("auto", "--quant", "-q", metavar=_QUANTS, help="auto, none, int8 or bf16 (as for a chat)."),
          device: str = typer.Option("auto", "--device", metavar="auto|cpu|cuda", help="auto, cpu or cuda."),
          host: str = typer.Option("127.0.0.1", "--host", metavar="ADDRESS", help="Address to bind (default: loopback only)."),
          port: int = typer.Option(8080, "--port", metavar="N", help="TCP port."),
          api_key: Optional[str] = typer.Option(None, "--api-key", metavar="KEY", envvar="TINYCHAT_API_KEY",
                                                help="Ask every /v1 request for this key (Authorization: Bearer "
                                                     "KEY). Default: $TINYCHAT_API_KEY, else none."),
          max_queue: int = typer.Option(16, "--max-queue", metavar="N", help="Requests that may wait behind the running one; "
                                        "more get 503 with Retry-After."),
          max_tokens: int = typer.Option(4096, "--max-tokens", metavar="N", help="The most max_tokens a request may ask for."),
          max_body: int = typer.Option(1 << 20, "--max-body", metavar="BYTES", help="The largest request body in bytes (413 past it)."),
          save_sessions: Optional[Path] = typer.Option(None, "--save-sessions", metavar="DIR",
                                                       help="Save each request as a session in DIR (`tinychat "
                                                            "replay DIR --check` verifies them)."),
          threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads (as for a chat).")):
    """Serve the model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,
    /health): one decoder, requests queued in order. Needs the serve extra: pip install 'tinychat\\[serve]'."""
    from .serve.config import ServeConfig
    from .serve.server import missing_extra
    why = missing_extra()
    if why:
        raise UsageError(why)
    check_choice("--quant", quant, QUANT_CHOICES)
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be between 0 and 65535 (got {port})")
    for name, v in (("--max-queue", max_queue), ("--max-tokens", max_tokens), ("--max-body", max_body)):
        if v < 1:
            raise UsageError(f"{name} must be at least 1 (got {v})")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty")
    if save_sessions is not None:
        try:
            save_sessions.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--save-sessions {save_sessions}: {e.strerror or e}") from None
    dev = resolve_device(device)
    tune = {}
    if check_threads(threads) is not None:
        import torch
        torch.set_num_threads(threads)
        tune = {"tune_threads": False}
    from .options import EngineOptions
    from .serve.server import serve as run_server
    config = ServeConfig(host=host, port=port, api_key=api_key, max_queue=max_queue, max_request_bytes=max_body,
                         max_tokens=max_tokens, save_sessions=save_sessions)
    raise typer.Exit(run_server(config, model, quant, dev, EngineOptions.from_env(**tune)))


@app.command()
def bench(model: Optional[Path] = typer.Option(None, "--model", "-m", metavar="PATH|NAME", help=MODEL_HELP, callback=_model_arg),
          config: Optional[str] = typer.Option(None, "--config", metavar="tiny|demo|full", help="A named size with random weights: tiny, demo, full."),
          quant: str = typer.Option("none", "--quant", "-q", metavar="|".join(QUANT_MODES), help="none, int8, int4 or bf16."),
          device: str = typer.Option("cpu", "--device", metavar="cpu|cuda", help="cpu or cuda."),
          prompt_len: int = typer.Option(100, "--prompt-len", metavar="N", help="Prompt tokens to prefill."),
          gen_len: int = typer.Option(64, "--gen-len", metavar="N", help="Tokens to decode."),
          repeats: int = typer.Option(3, "--repeats", metavar="N", help="Timed repeats (medians are reported)."),
          threads: Optional[int] = typer.Option(None, "--threads", metavar="N", help="CPU threads, pinned (default: torch's, with "
                                                "the int8 step's thread tuning on)."),
          json_out: bool = typer.Option(False, "--json", help="Print one JSON object.")):
    """Measure prefill tok/s, time to first token, batch-1 decode tok/s, KV bytes per token and peak RSS."""
    import json

    from .bench import render_table, run_bench
    check_choice("--quant", quant, QUANT_MODES)
    check_choice("--device", device, ("cpu", "cuda"))
    if config is not None:
        check_choice("--config", config, tuple(SIZES))
    if model is not None and config is not None:
        raise UsageError("give --model or --config, not both")
    check_threads(threads)
    if json_out or not sys.stderr.isatty():
        result = run_bench(model, config, quant, device, prompt_len, gen_len, repeats, threads=threads)
    else:
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task("benchmark", total=None)

            def progress(done, total, what):
                bar.update(task, completed=done, total=total, description=what)

            result = run_bench(model, config, quant, device, prompt_len, gen_len, repeats, progress=progress,
                               threads=threads)
    if json_out:
        typer.echo(json.dumps(result))
    else:
        from rich.console import Console
        Console().print(render_table(result))


@app.command()
def pull(ref: str = typer.Argument(..., metavar="REPO[:QUANT][@REVISION]",
                                   help="A model on the Hugging Face Hub, ORG/NAME; :QUANT picks a GGUF file (default "
                                        "Q8_0, else the closest); @REVISION a branch, tag or commit."),
         name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="The model's name (default: the repo's name, with the "
                                            "quant for a GGUF: SmolLM2-360M-Instruct-Q8_0)."),
         list_: bool = typer.Option(False, "--list", help="Show the repo's GGUF quants and sizes (or the files a "
                                    "safetensors repo needs); pull nothing."),
         offline: bool = typer.Option(False, "--offline", help="Use only the Hugging Face cache, no network "
                                      "(also HF_HUB_OFFLINE=1)."),
         quant: str = typer.Option("none", "--quant", metavar="none|int8|int4", help="Store packed weights: int8, or int4 (as --quant makes them at start; no fp32 copy, nothing quantized at load)."),
         force: bool = typer.Option(False, "--force", help="Replace a model of the same name pulled from elsewhere.")):
    """Download a model from the Hugging Face Hub into its standard cache, then import it (`tinychat import`).

    The files go where huggingface_hub keeps them (HF_HOME / HF_HUB_CACHE; llama.cpp, mlx and `hf download` find
    them there too); the imported model under the data folder. HF_TOKEN opens gated repos, HF_ENDPOINT points at a
    mirror. The size is shown first, and a disk without room refused. Run an interrupted pull again to finish it."""
    if offline:     # the whole client offline (read by huggingface_hub when it is imported, just below)
        os.environ["HF_HUB_OFFLINE"] = "1"
    from .hub.pull import Interrupted, plan
    if list_:
        _list_pull(plan(ref, offline))
        return
    try:
        r = _run_pull(ref, name=name, offline=offline, force=force, quant=quant)
    except Interrupted as e:
        from .hub.ref import human_bytes
        typer.echo(f"interrupted at {human_bytes(e.done)} of {human_bytes(e.total)}: `tinychat pull {ref}` resumes "
                   f"the download (nothing was imported)", err=True)
        raise typer.Exit(130)
    if r.up_to_date:
        typer.echo(f"{r.name} is up to date ({r.plan.ref.repo} at {r.plan.commit[:12]})\n"
                   f"chat with: tinychat --model {r.name}")
    else:
        typer.echo(f"pulled {r.plan.ref} as {r.name} ({r.path})\nchat with: tinychat --model {r.name}")


def _run_pull(ref: str, **kw):
    """hub.pull.pull on the console: the download's bar and lines, then the import's progress line (as `tinychat
    import` shows it)."""
    from contextlib import ExitStack

    from .hub.progress import ConsoleReport
    from .hub.pull import Interrupted
    from .hub.pull import pull as run_pull
    report = ConsoleReport()
    with ExitStack() as stack:
        shown = []

        def import_progress(done: int, total: int, what: str) -> None:
            if not shown:
                report.close()              # the download's summary line, before the import's progress line
                shown.append(stack.enter_context(_progress(f"import {ref}"))[0] or (lambda *a: None))
            shown[0](done, total, what)
        try:
            return run_pull(ref, report=report, import_progress=import_progress, **kw)
        except Interrupted:
            report.close(summary=False)
            raise
        finally:
            report.close()


def _list_pull(p) -> None:
    from .hub.ref import human_bytes
    where = " (in the cache)" if p.offline else ""
    if p.kind == "gguf":
        typer.echo(f"{p.ref.repo} at {p.commit[:12]}{where}: GGUF files by quant (pull one with "
                   f"tinychat pull {p.ref.repo}:QUANT)")
        for c in p.choices:
            mark = "  (default)" if c is p.choice and not p.ref.quant else ""
            split = f" (split in {len(c.files)}: not importable)" if c.split else ""
            typer.echo(f"  {c.quant:10} {human_bytes(c.size):>10}  {c.files[0]}{split}{mark}")
        return
    st = sorted(f for f in p.sizes if f.endswith(".safetensors") and "/" not in f)
    files = [f for f in p.files if not f.endswith(".safetensors")] + st
    typer.echo(f"{p.ref.repo} at {p.commit[:12]}{where}: safetensors; a pull fetches {', '.join(files)} "
               f"({human_bytes(sum(p.sizes.get(f, 0) for f in files))})")


@app.command("import")
def import_(src: Path = typer.Argument(..., metavar="SRC", help="A Hugging Face llama-family folder, a .gguf file, or "
                                       "the id of a repo in the Hugging Face cache (ORG/NAME[:QUANT])."),
            name: Optional[str] = typer.Option(None, "--name", metavar="NAME", help="The model's name (default: from SRC)."),
            context: Optional[int] = typer.Option(None, "--context", metavar="N", help="Most positions a chat may hold "
                                                  "(default: 4096, or less when the checkpoint says so)."),
            dtype: str = typer.Option("float32", "--dtype", metavar="float32|bfloat16|float16", help="Stored weights: float32 (exact), bfloat16 or float16."),
            quant: str = typer.Option("none", "--quant", metavar="none|int8|int4", help="Store packed weights: int8, or int4 (as --quant makes them at start; no fp32 copy, nothing quantized at load)."),
            force: bool = typer.Option(False, "--force", help="Replace a model of the same name.")):
    """Import a llama-family checkpoint (SmolLM2, Qwen2.5, Llama-architecture models) as a tinychat model.

    The result goes under the data folder and opens with `tinychat --model NAME`. Mixture-of-experts, sliding-window
    and other architectures the engine cannot run are refused with the reason."""
    from .importer import import_model
    if not src.exists():
        from .hub.ref import is_repo_id, parse_ref
        if is_repo_id(str(src)) and not str(src).lower().endswith(".gguf"):   # from the HF cache, never the network
            from .hub.cache import hub_cache, snapshot_for
            if snapshot_for(parse_ref(str(src))) is None:
                raise UsageError(f"{src}: no such file or folder here, nor a repo in the Hugging Face cache "
                                 f"({hub_cache()}): tinychat pull {src} downloads it")
            r = _run_pull(str(src), name=name, offline=True, force=force, context=context, dtype=dtype, quant=quant)
            typer.echo(f"imported {r.plan.ref} from the Hugging Face cache as {r.name} ({r.path})\n"
                       f"chat with: tinychat --model {r.name}")
            return
    with _progress(f"import {src.name}") as (progress, _):
        dest = import_model(src, name=name, context=context, dtype=dtype, force=force, progress=progress, quant=quant)
    from .textsafe import safe_line
    typer.echo(safe_line(f"imported {src} as {dest.name} ({dest})"))
    typer.echo(f"chat with: tinychat --model {dest.name}")


models_app = typer.Typer(help="Imported models: list them (plain `tinychat models`), rm NAME.",
                         invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
app.add_typer(models_app, name="models")


@models_app.callback(invoke_without_command=True)
def models_(ctx: typer.Context, json_out: bool = typer.Option(False, "--json", help="A JSON list (models in the "
                                                              "Hugging Face cache follow, with \"imported\": false).")):
    """List the imported models (`tinychat import`, `tinychat pull`) with their size on disk, then the models in the
    Hugging Face cache that could be imported without downloading (`tinychat import REPO`)."""
    if ctx.invoked_subcommand is not None:
        return
    from .importer.store import human_bytes, list_models
    from .textsafe import safe_line
    rows = list_models()
    cached = _cached_not_imported(rows)
    if json_out:
        import json
        typer.echo(json.dumps(rows + cached))
        return
    if not rows:
        typer.echo("no imported models (add one with: tinychat pull ORG/NAME, or tinychat import SRC)")
    for r in rows:
        params = f"{r['params'] / 1e6:.0f}M params" if r.get("params") else "?"
        stored = f"  stored {r['quant']}" if r.get("quant") else ""
        typer.echo(safe_line(f"{r['name']}  {params}  {human_bytes(r['disk_bytes'])} on disk{stored}  {r['format']}  "
                             f"from {r['source']}"))
    if rows:
        total = sum(r["disk_bytes"] for r in rows)
        typer.echo(safe_line(f"{len(rows)} model{'s' if len(rows) != 1 else ''}, {human_bytes(total)} on disk in "
                             f"{Path(rows[0]['path']).parent}"), err=True)
    if cached:
        from .hub.cache import hub_cache
        typer.echo(safe_line(f"\nin the Hugging Face cache ({hub_cache()}), to import without downloading:"))
        for c in cached:
            typer.echo(safe_line(f"  tinychat import {c['repo']:40}  {c['format']}  {c['bytes'] / 2**20:.0f} MiB"
                                 + (f"  ({', '.join(c['quants'])})" if c["quants"] else "")))


@models_app.command("rm")
def models_rm(name: str = typer.Argument(..., metavar="NAME", help="An imported model's name (`tinychat models`).")):
    """Delete an imported model; refused while a chat has it open (or an import writes it)."""
    from .importer.store import remove_model
    from .textsafe import safe_line
    path = remove_model(name)
    typer.echo(safe_line(f"deleted {name} ({path})"), err=True)


def _cached_not_imported(rows: list[dict]) -> list[dict]:
    """The importable repos of the Hugging Face cache that no imported model was pulled from (at that commit);
    [] without huggingface_hub."""
    try:
        from .hub.cache import cached_repos
        repos = cached_repos()
    except Exception:  # noqa: BLE001  no huggingface_hub, an unreadable cache: list the imported models alone
        return []
    import json
    have = set()
    for r in rows:
        try:
            hub = json.loads((Path(r["path"]) / "import.json").read_text(encoding="utf-8")).get("hub") or {}
            have.add((hub.get("repo"), hub.get("commit")))
        except (OSError, ValueError, AttributeError):
            continue
    return [{"name": None, "repo": c.repo, "imported": False, "path": str(c.snapshot), "source":
             f"{c.repo}@{c.commit[:12]} (Hugging Face cache)", "format": c.kind, "params": None, "bytes": c.size,
             "quants": c.quants} for c in repos if (c.repo, c.commit) not in have]


def _missing_argument(e: Exception) -> str | None:
    """A missing argument by the name --help shows (click said "Missing parameter: ref"), or None for any other
    error. Typer vendors click, so its exceptions are matched by name, not class."""
    param, ctx = getattr(e, "param", None), getattr(e, "ctx", None)
    if type(e).__name__ != "MissingParameter" or param is None:
        return None
    names = []
    while ctx is not None and getattr(ctx, "parent", None) is not None:    # the root is "tinychat" however run
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    where = " ".join(["tinychat", *names])
    name = getattr(param, "metavar", None) or str(getattr(param, "name", "") or "an argument").upper()
    hint = "; `tinychat sessions` lists the saved chats" if name.startswith("ID") else ""
    return f"{where} needs {name} (see {where} --help{hint})"


def main() -> None:
    """Entry point: run the Typer app. An expected failure (a TinychatError, a bad flag, an OS error naming its file)
    prints one line and exits 2; anything else is a bug: "internal error", exit 70. TINYCHAT_DEBUG=1 or --debug
    shows the traceback."""
    if "--debug" in sys.argv:
        sys.argv.remove("--debug")
        os.environ["TINYCHAT_DEBUG"] = "1"
    try:
        rc = app(standalone_mode=False)     # returns the code of typer.Exit instead of exiting
        sys.exit(rc if isinstance(rc, int) else 0)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001  one line for the user; the traceback with --debug
        sys.exit(_report(e))


def _report(e: Exception) -> int:
    """Print e as one line on stderr and return the exit code (see tinychat/errors.py)."""
    import click

    from .errors import EXIT_INTERNAL, EXIT_USER, TinychatError
    if isinstance(e, click.exceptions.Abort):
        return 130
    if isinstance(e, click.ClickException):
        e.show()
        return EXIT_USER
    if _debug():
        raise e
    from .textsafe import safe_line
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    missing = _missing_argument(e)
    # typer vendors click: its exceptions are matched by name
    from_click = any(c.__name__ in ("ClickException", "Abort") for c in type(e).__mro__)
    if missing or from_click or isinstance(e, (TinychatError, OSError)):
        print(f"tinychat: error: {safe_line(missing or text)}", file=sys.stderr)
        return EXIT_USER
    print(f"tinychat: internal error: {safe_line(type(e).__name__ + ': ' + text)} (a bug in tinychat; rerun with "
          "--debug for the traceback)", file=sys.stderr)
    return EXIT_INTERNAL
