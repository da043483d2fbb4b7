"""`tinychat --plain`: a line REPL over the chat runtime. With stdin not a terminal, each input line is one user
turn and stdout carries only the replies (`--json`: one JSON object per assistant turn); notices go to stderr."""
from __future__ import annotations

import json
import shutil
import sys
import textwrap
import threading

from . import commands
from .chat.runtime import Chat, ChatError, TurnResult
from .sampler_defaults import TINYCHAT
from .sessions.session import SessionError
from .textin import lf
from .textsafe import plural, safe_line, safe_text

PLAIN_HANDLERS = commands.Handlers("plain")     # the plain mode's handler of each command of the table (below, in PlainREPL)
ENDLESS = 64 << 20      # characters of one line dropped before the input counts as endless (/dev/zero), not text


class PlainREPL:
    def __init__(self, chat: Chat, json_out: bool = False, stdin=None, stdout=None, stderr=None, restore=None):
        self.chat, self.json_out = chat, json_out
        self.stdin, self.stdout, self.stderr = stdin or sys.stdin, stdout or sys.stdout, stderr or sys.stderr
        self.interactive = self.stdin.isatty() and self.stdout.isatty()
        self.restore = restore            # callable(session_id) -> Chat, for /load
        self.errors = 0
        self._noted = 0                   # nativebuild.NOTICES shown so far

    def note(self, msg: str) -> None:
        """A line (or lines) for the user on stderr: control characters escaped (textsafe), whatever it holds."""
        print(safe_text(msg), file=self.stderr, flush=True)

    def out(self, text: str) -> None:
        """Reply text on stdout, whether a terminal or a pipe: control characters as visible escapes (a reply holding
        ESC ] 0 ; ... BEL set the terminal's title); the exact text is in --json (and `sessions export`)."""
        print(safe_text(text), file=self.stdout, flush=True)

    def run(self) -> int:
        if self.interactive:
            st = self.chat.status()
            mode = f"{st['mode']} (--quant auto: {st['auto']})" if st.get("auto") else st["mode"]
            self.note(f"tinychat · {st['model']} · {mode} · session {st['session']} · /help for commands")
        self.show_notice()
        _replace_bad_bytes(self.stdin)
        queued: list[str] = []              # the rest of a read that held lone CRs (each one ends a line too)
        while True:
            if not queued:
                try:
                    if self.interactive:
                        self.stdout.write("you> ")
                        self.stdout.flush()
                    limit = self.chat.input_limit()
                    read = self.stdin.readline(limit + 2)       # a line is read with a bound (a pipe of /dev/zero)
                    if len(read) - read.endswith("\n") > limit:
                        rest, dropped = read, 0
                        while rest and not rest.endswith("\n") and dropped < ENDLESS:      # the rest of the line
                            rest = self.stdin.readline(1 << 16)
                            dropped += len(rest)
                        self.errors += 1
                        self.note(f"error: message too long: more than {limit:,} characters cannot fit the "
                                  f"{self.chat.max_len:,}-token context (the line was skipped)")
                        if rest and not rest.endswith("\n"):     # a line without end (/dev/zero): not text
                            self.note("error: the input is one endless line, not lines of text: stopped reading it")
                            break
                        continue
                except KeyboardInterrupt:
                    self.note("")
                    break
                except UnicodeDecodeError:      # a stream that could not be told to replace bad bytes
                    self.errors += 1
                    self.note("error: input that is not UTF-8 text was skipped")
                    continue
                if not read:
                    break
                # CRLF and a lone CR end a line as LF does (a Windows file, an old Mac one, a pasted CR)
                queued = lf(_valid_text(read)).split("\n")
                if queued[-1] == "":
                    queued.pop()
                if not queued:
                    continue
            line = queued.pop(0)
            if not line.strip():
                continue
            if line.startswith("/"):
                if self.command(line) == "quit":
                    break
                continue
            self.turn(lambda on_token, on_reply: self.chat.send(line, on_token=on_token, on_reply=on_reply))
        return 0 if self.interactive or not self.errors else 2

    def show_notice(self) -> None:
        """The chat's one line from opening it (a restore's snapshot not used, 4-bit weights on a small model), on stderr."""
        if getattr(self.chat, "notice", None):
            self.note(f"note: {self.chat.notice}")

    def _build_notes(self) -> None:
        """Each note of the kernels' build not yet shown (a cache folder that could not be used), once."""
        from .nativebuild import NOTICES
        for note in NOTICES[self._noted:]:
            self.note(safe_line(f"note: {note}"))
        self._noted = len(NOTICES)

    def _save_warning(self, warning: str | None) -> None:
        if warning:
            self.errors += 1
            self.note(safe_line(f"warning: {warning}"))

    # -- turns --------------------------------------------------------------------------------------------------
    def turn(self, fn) -> TurnResult | None:
        """Run a turn in a worker thread so Ctrl-C can stop it cleanly (the cache stays well-formed). `fn(on_token,
        on_reply)`: the reply is shown through on_reply before the chat saves it, so a failed save never hides it."""
        self._build_notes()
        shown: dict = {}
        stream = self.interactive and not self.json_out

        held = [""]                         # a \r at the end of a piece: it may start a \r\n

        def on_token(i, tok, text, tr, ms):
            if stream and text:
                text, held[0] = held[0] + text, ""
                if text.endswith("\r"):
                    text, held[0] = text[:-1], "\r"
                self.stdout.write(safe_text(text))
                self.stdout.flush()

        def on_reply(r):
            shown["shown"] = True
            self._show(r, stream)

        if stream:
            self.stdout.write("bot> ")
        box = self._in_worker(lambda: fn(on_token, on_reply))
        if stream and held[0]:
            self.stdout.write(safe_text(held[0]))
        box.update(shown)
        if "error" in box:
            if stream:
                self.stdout.write("\n")
            self._error(box["error"])
            return None
        r: TurnResult = box["result"]
        if not box.get("shown"):
            self._show(r, stream)
        self._save_warning(r.save_warning)
        if r.notice:
            self.note(safe_line(f"note: {r.notice}"))
        if r.dropped_turns:
            self.note(f"[context full: dropped the {r.dropped_turns} oldest turn(s)]")
        if self.chat.trace:
            self.print_trace(r)
        return r

    def _in_worker(self, fn) -> dict:
        """Run fn() on a worker thread, so that Ctrl-C can stop the turn cleanly (chat.cancel: the cache stays
        well-formed); returns {"result": ...} or {"error": the exception}. The thread is joined before this returns:
        a worker still unwinding (freeing the turn's tensors releases the GIL) when the interpreter finalizes is
        ended inside PyTorch's C++ code, which aborts the process ("terminate called without an active exception",
        exit 134), so no worker may outlive its turn."""
        box: dict = {}
        done = threading.Event()

        def work():
            try:
                box["result"] = fn()
            except BaseException as e:  # noqa: BLE001  reported on the main thread
                box["error"] = e
            finally:
                done.set()

        worker = threading.Thread(target=work, name="tinychat-turn")
        worker.start()
        # an Event, not Thread.join: a join interrupted by Ctrl-C can leave is_alive() False while the turn runs
        while not done.is_set():
            try:
                done.wait(0.1)
            except KeyboardInterrupt:
                self.chat.cancel()
        while worker.is_alive():            # the turn is over: only the thread's own teardown is left
            try:
                worker.join(0.1)
            except KeyboardInterrupt:
                pass
        return box

    def _show(self, r: TurnResult, stream: bool) -> None:
        if self.json_out:
            # the session it is saved in (the save follows this line), null with --no-save
            summary = {**r.summary(), "session": self.chat.session.id if self.chat.autosave else None}
            print(json.dumps(summary), file=self.stdout, flush=True)
        elif stream:
            self.stdout.write("\n")
            if r.finish != "stop":
                self.note(f"[{r.finish}: {r.n_tokens} tokens]")
        else:
            self.out(r.text)

    def _error(self, e: Exception) -> None:
        if isinstance(e, (ChatError, SessionError, ValueError, RuntimeError, OSError)):
            self.errors += 1
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            self.note(safe_line(f"error: {msg}"))
        else:
            raise e

    def print_trace(self, r: TurnResult) -> None:
        tok = self.chat.tok
        for tr in r.traces:
            mark = (" ENDED" if getattr(tr, "ended", False) else "") + (" LIFTED" if tr.lifted else "") + \
                (f" banned {len(tr.banned)}" if tr.banned else "")
            alts = ", ".join(f"{tok.decode([c.token])!r} {c.p_final:.2f}{'✗' if c.banned_by else ''}"
                             f"{'↓' if c.penalised else ''}" for c in tr.candidates[:4])
            self.note(f"  {tr.index:4d} {tok.decode([tr.token])!r:14} rank {tr.rank:2d} p {tr.p_final:.3f}{mark}"
                      f"  [{alts}]")
        s = r.stats
        self.note(f"  banned {s.banned_tokens} candidates in {s.banned_steps} steps (mass {s.banned_mass:.2f}), "
                  f"{s.lifts} dead-end lifts, {s.penalised} ids penalised")

    # -- the sampler A/B ----------------------------------------------------------------------------------------
    def ab(self, changes: dict[str, str]) -> None:
        """/ab KEY=VALUE ...: both replies (side by side on a wide terminal, else one after the other; --json: one
        object), the first differing token (between ⟦ ⟧) and its cause, and how to keep B."""
        from .chat.ab import place_of, run_ab
        box = self._in_worker(lambda: run_ab(self.chat, changes))
        if "error" in box:
            self._error(box["error"])
            return
        r = box["result"]
        if self.json_out:
            print(json.dumps(r.summary()), file=self.stdout, flush=True)
        else:
            width = shutil.get_terminal_size((80, 24)).columns
            left, right = f"A (current settings): {_mark(r.a)}", f"B ({r.label}): {_mark(r.b)}"
            lines = side_by_side(left, right, width) if self.interactive and width >= 100 else [left, right]
            self.out("\n".join(lines))
        where = "" if r.diff is None else f"first difference at token {r.diff}: "    # the cause says "no difference"
        self.note(safe_line(f"A/B, seed {r.seed}: {where}{r.cause}"))
        pa, pb = place_of(self.chat, r.a), place_of(self.chat, r.b)
        n = self.chat.alternatives()[1]
        sets = "; ".join(f"/set {k.replace('_', '-')} {v}" for k, v in r.changes.items())
        self.note(safe_line(f"A is the active reply ({pa}/{n}); /alt {pb} keeps B (and {sets} adopts its settings)"))
        self._save_warning(self.chat.save_warning)

    # -- slash commands ---------------------------------------------------------------------------------------
    def command(self, line: str) -> str | None:
        """Run one slash command (its handler in PLAIN_HANDLERS, by the table's name); "quit" to leave."""
        cmd, args = commands.parse(line)
        try:
            return PLAIN_HANDLERS.find(cmd)(self, args)
        except (commands.CommandError, ChatError, SessionError) as e:
            self.errors += 1
            self.note(safe_line(f"error: {e}"))
        return None

    @PLAIN_HANDLERS("/quit")
    def _quit(self, args: list[str]) -> str:
        return "quit"

    @PLAIN_HANDLERS("/help")
    def _help(self, args: list[str]) -> None:
        self.note(commands.plain_help())

    @PLAIN_HANDLERS("/new")
    def _new(self, args: list[str]) -> None:
        self.chat.new_session()
        self.note(f"new chat: session {self.chat.session.id}")

    @PLAIN_HANDLERS("/save")
    def _save(self, args: list[str]) -> None:
        try:
            path = self.chat.save(" ".join(args) or None)
        except OSError as e:
            raise ChatError(f"not saved: {e}") from None
        self.note(f"saved {path}" if path else "nothing to save yet")

    @PLAIN_HANDLERS("/load")
    def _load(self, args: list[str]) -> None:
        if len(args) != 1:
            raise ChatError("usage: /load ID")
        if self.restore is None:
            raise ChatError("/load is not available here")
        old, self.chat = self.chat, self.restore(args[0])
        if old is not self.chat:
            old.close()             # its session's lock: another process may open it now
        self.note(f"continuing session {self.chat.session.id} ({plural(self.chat.session.n_turns, 'turn')})")
        self.show_notice()

    @PLAIN_HANDLERS("/set")
    def _set(self, args: list[str]) -> None:
        kv = commands.parse_set(args)
        if kv is None:
            from_ = getattr(self.chat, "sources", {})
            for k, v in vars(self.chat.settings).items():
                self.note(safe_line(f"  {k.replace('_', '-'):15} {v!r:12} {from_.get(k, TINYCHAT)}"))
            return
        st = self.chat.set(*kv)
        key = kv[0].replace("-", "_")
        key = "system_prompt" if key == "system" else key
        self.note(f"{kv[0]} = {getattr(st, key, '')!r} (from the next turn)")

    @PLAIN_HANDLERS("/regen")
    def _regen(self, args: list[str]) -> None:
        self.turn(lambda on_token, on_reply: self.chat.regenerate(on_token=on_token, on_reply=on_reply))

    @PLAIN_HANDLERS("/fork")
    def _fork(self, args: list[str]) -> None:
        pos, token = commands.parse_fork(args)
        r = self.turn(lambda on_token, on_reply: self.chat.fork(pos, token, on_token=on_token, on_reply=on_reply))
        if r is not None:
            at, n = self.chat.alternatives()
            self.note(f"reply {at}/{n}: forked at token {pos}")

    @PLAIN_HANDLERS("/alt")
    def _alt(self, args: list[str]) -> None:
        at, n = self.chat.switch_alternative(commands.parse_alt(args))
        self.note(f"reply {at}/{n}")
        if not self.json_out:
            self.out(self.chat.session.messages[-1].content)
        self._save_warning(self.chat.save_warning)

    @PLAIN_HANDLERS("/ab")
    def _ab(self, args: list[str]) -> None:
        self.ab(commands.parse_ab(args))

    @PLAIN_HANDLERS("/undo")
    def _undo(self, args: list[str]) -> None:
        user = self.chat.undo()
        self.note(f"took back: {user.content[:60]!r}")
        self._save_warning(self.chat.save_warning)

    @PLAIN_HANDLERS("/trace")
    def _trace(self, args: list[str]) -> None:
        self.chat.trace = commands.parse_trace(args)
        self.note(f"trace {args[0]}")

    @PLAIN_HANDLERS("/info")
    def _info(self, args: list[str]) -> None:
        for k, v in self.chat.status().items():
            self.note(f"  {k:13} {v}")

def _mark(side) -> str:
    """A side's text with its first differing token between ⟦ ⟧."""
    mark = f"⟦{side.token_text}⟧" if side.token_text else ""
    return safe_text(side.before + mark + side.after)


def side_by_side(left: str, right: str, width: int) -> list[str]:
    """Two texts in two columns of (width - 3) // 2, wrapped at words; ' │ ' between them."""
    col = max(10, (width - 3) // 2)

    def wrap(t: str) -> list[str]:
        return [w for para in t.split("\n") for w in (textwrap.wrap(para, col) or [""])]
    a, b = wrap(left), wrap(right)
    n = max(len(a), len(b))
    return [f"{x:<{col}} │ {y}".rstrip() for x, y in zip(a + [""] * (n - len(a)), b + [""] * (n - len(b)))]


def _replace_bad_bytes(stream) -> None:
    """Invalid UTF-8 on stdin becomes U+FFFD instead of an exception that ends the run (a text stream that can)."""
    reconfigure = getattr(stream, "reconfigure", None)
    if reconfigure is not None and (getattr(stream, "encoding", "") or "").lower().replace("-", "") == "utf8":
        try:
            reconfigure(errors="replace")
        except (ValueError, OSError, TypeError):  # a stream that cannot change now: _valid_text still cleans
            pass


def _valid_text(line: str) -> str:
    """A line without lone surrogates (what surrogateescape makes of invalid bytes): they become U+FFFD."""
    try:
        line.encode("utf-8")
        return line
    except UnicodeEncodeError:
        pass
    try:
        return line.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:          # surrogates that are not escaped bytes
        return line.encode("utf-8", "replace").decode("utf-8")
