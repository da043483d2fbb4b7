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
from .cli_common import (_QUANTS, MODEL_HELP, UsageError, _debug, _model_arg, _progress,  # noqa: F401  (re-exported)
                         _stderr_is_terminal, load_session_noting, reflow_help, strict_numbers)
from .cli_info import info
from .cli_models import import_, models_app, pull
from .cli_serve import serve
from .cli_sessions import sessions_app
from .hub import RECOMMENDED_NAME, RECOMMENDED_PULL
from .loading import (check_choice, check_threads, load_runtime, model_for_session, open_chat, open_replay_chat,
                      resolve_device, resolve_quant, session_model)

HELP = """Chat with a small local TinyAgentLM model in the terminal.

With no command, opens the chat app (a line mode with --plain, or when piped: each input line is one turn).
Every chat is saved as a session; `tinychat sessions` lists them and `--session ID` continues one.

The shipped model is a 21.7M-parameter demo: fluent, not a source of facts. A real one in one command:
{RECOMMENDED_PULL} (then: tinychat -m {RECOMMENDED_NAME}).

Examples:  tinychat -p "Why is the sky blue?"  ·  echo "Hi!" | tinychat --plain --json  ·  tinychat replay ID --check

Errors print one line and exit 2 (70: a bug in tinychat, please report it); --debug shows the traceback.""".format(RECOMMENDED_PULL=RECOMMENDED_PULL,
                                                                          RECOMMENDED_NAME=RECOMMENDED_NAME)

app = typer.Typer(add_completion=False, no_args_is_help=False, rich_markup_mode="rich", help=HELP,
                  context_settings={"help_option_names": ["-h", "--help"]})


def _d(text: str, key: str) -> str:
    """A sampler flag's help with its default: tinychat's value, which a model's sampler.json may change."""
    from .settings import ChatSettings
    v = getattr(ChatSettings(), key)
    v = ("on" if v else "off") if isinstance(v, bool) else f"{v:g}" if isinstance(v, float) else v
    return f"{text} Default: {v} (or the model's own: tinychat info -m NAME)."


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
    options = engine_options(tune, one_shot=reader is not None)
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
    repl.show_notice()
    r = repl.turn(lambda on_token, on_reply: chat_.send(prompt, on_token=on_token, on_reply=on_reply))
    raise typer.Exit(0 if r is not None and not repl.errors else 2)


def _session_and_saving(session: str | None, continue_: bool, save: bool | None, one_shot: bool, app: bool):
    """(the session to continue or None, whether to save): -c is the most recent session; the app opens it too when
    the reopen_last preference is on (and no session was named); --save / --no-save, else for one-shots (-p, -f)
    the save_one_shots preference, else save."""
    from .loading import latest_session
    from .prefs import load_prefs
    from .textsafe import safe_line
    prefs, why = load_prefs()
    if why:
        print(f"tinychat: note: {safe_line(why)}", file=sys.stderr)
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


def engine_options(tune: dict, one_shot: bool, env=None):
    """The chat's EngineOptions: the environment's, then tune. A one-shot (-p / -f) leaves its weights where they load
    (huge_pages off) unless TINYCHAT_HUGE_PAGES says otherwise: copying them onto huge pages costs about as much as
    decoding ~180 tokens saves (docs/benchmarks.md, "Weights on huge pages"), and a one-shot's start is its speed."""
    from .options import EngineOptions
    env = os.environ if env is None else env
    kw = dict(tune)
    if one_shot and EngineOptions.ENV["huge_pages"] not in env:
        kw["huge_pages"] = False
    return EngineOptions.from_env(env, **kw)


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


app.command()(info)
app.add_typer(sessions_app, name="sessions")


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
    sess = load_session_noting(ref)
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


app.command()(serve)


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
          kv_cache: Optional[str] = typer.Option(None, "--kv-cache", metavar="auto|fp16|fp32", help="The CPU KV cache "
                                                 "of an int8 / int4 llama-family model (default: TINYCHAT_KV_CACHE, "
                                                 "else auto: fp16 where the native step runs)."),
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
    from .options import EngineOptions
    if kv_cache is not None:
        check_choice("--kv-cache", kv_cache, EngineOptions.KV_CACHES)
    options = EngineOptions.from_env(**({"kv_cache": kv_cache} if kv_cache else {}))
    if json_out or not sys.stderr.isatty():
        result = run_bench(model, config, quant, device, prompt_len, gen_len, repeats, threads=threads,
                           options=options)
    else:
        from rich.progress import Progress
        with Progress(transient=True) as bar:
            task = bar.add_task("benchmark", total=None)

            def progress(done, total, what):
                bar.update(task, completed=done, total=total, description=what)

            result = run_bench(model, config, quant, device, prompt_len, gen_len, repeats, progress=progress,
                               threads=threads, options=options)
    if json_out:
        typer.echo(json.dumps(result))
    else:
        from rich.console import Console
        Console().print(render_table(result))


app.command()(pull)
app.command("import")(import_)
app.add_typer(models_app, name="models")
reflow_help(app)                    # docstrings' source line breaks out of --help
strict_numbers(app)                 # int / float flags: ASCII digits only


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


def entry() -> None:
    """The `tinychat` command (and `python -m tinychat`): main(), then exit without tearing torch down. Once torch is
    imported, the interpreter's module teardown at exit takes ~0.4 s (seen on AMD Zen 4 and Intel Xeon guests) after
    the reply is printed and the session saved. With only this thread left, stdout and stderr are flushed and the
    atexit handlers run (temp folders, logging), then the process ends at once with main's exit code. Tests call
    main() and keep the normal exit; TINYCHAT_SLOW_EXIT=1 keeps it too."""
    try:
        main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    _quick_exit(code)


def _quick_exit(code: object) -> None:
    import threading
    if "torch" not in sys.modules or threading.active_count() > 1 or os.environ.get("TINYCHAT_SLOW_EXIT"):
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):         # sys.exit("message"): printed, exit 1, as Python does
        print(code, file=sys.stderr)
        code = 1
    import atexit
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):       # a closed pipe: nothing left to say to it
            pass
    atexit._run_exitfuncs()
    os._exit(code & 0xFF)


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
    if from_click and callable(getattr(e, "format_message", None)):     # a bad value names its flag
        text = str(e.format_message()).strip().splitlines()[0] or text
    if missing or from_click or isinstance(e, (TinychatError, OSError)):
        print(f"tinychat: error: {safe_line(missing or text)}", file=sys.stderr)
        return EXIT_USER
    print(f"tinychat: internal error: {safe_line(type(e).__name__ + ': ' + text)} (a bug in tinychat; rerun with "
          "--debug for the traceback)", file=sys.stderr)
    return EXIT_INTERNAL
