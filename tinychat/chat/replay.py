"""Replay: regenerate every assistant turn of a session with its recorded settings and seed, on the recorded
history, and report where the regeneration departs from the record (turn, position, both tokens and their
probabilities). After each turn the recorded tokens are fed, so every turn is checked on its own."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ..identity import other_model
from ..sessions import session as session_files
from ..sessions import tree
from ..sessions.check import text_matches
from .branches import turn_settings
from .quant_steps import describe_step  # noqa: F401  (replay.describe_step: its name before quant_steps.py)
from .runtime import Chat, ChatError, ChatSettings


@dataclass
class Divergence:
    turn: int                # 1-based assistant turn
    position: int            # token index within the reply
    recorded: int | None     # None: the regeneration went on past the recorded end
    replayed: int | None     # None: the regeneration stopped before it
    p_recorded: float | None
    p_replayed: float | None
    recorded_text: str = ""
    replayed_text: str = ""

    def describe(self) -> str:
        def tok(t, txt, p):
            if t is None:
                return "(end)"
            return f"{t} {txt!r}" + (f" p={p:.4f}" if p is not None else "")
        return (f"turn {self.turn}, token {self.position}: recorded {tok(self.recorded, self.recorded_text, self.p_recorded)}"
                f", replayed {tok(self.replayed, self.replayed_text, self.p_replayed)}")


@dataclass
class TurnReplay:
    turn: int
    tokens: list[int]                      # regenerated
    recorded: list[int]
    timing_ms: list[float] | None          # recorded pace, for playback
    traces: list = field(default_factory=list)
    divergence: Divergence | None = None
    step: str | None = None                # the int8 step the turn was recorded with (None: not recorded)
    step_here: str | None = None           # the one it was replayed on (its own where this machine has it)
    text_problem: str | None = None        # the turn's text is not what its tokens hold: not token-exact either


@dataclass
class ReplayReport:
    session_id: str
    turns: list[TurnReplay]

    step_here: str | None = None           # the int8 step this machine runs (None: not an int8 replay)

    @property
    def step_mismatch(self) -> list[TurnReplay]:
        """Turns that differ and were recorded with another int8 step than this machine runs: the two steps round
        differently, so their tokens are not expected to match (not a divergence)."""
        return [t for t in self.turns if t.divergence is not None and t.step and t.step != t.step_here]

    @property
    def divergences(self) -> list[Divergence]:
        other = {id(t) for t in self.step_mismatch}
        return [t.divergence for t in self.turns if t.divergence is not None and id(t) not in other]

    @property
    def unknown_step(self) -> bool:
        """An int8 replay of turns that do not record their step (files from before it was recorded)."""
        return self.step_here is not None and any(t.step is None for t in self.turns)

    def step_note(self) -> str | None:
        """One line on the int8 steps, when they explain (or may explain) a difference; None otherwise."""
        if self.step_mismatch:
            t = self.step_mismatch[0]
            return f"turn {t.turn}: recorded with {describe_step(t.step)}, which this machine does not have (it " \
                   f"runs {describe_step(t.step_here)}, which rounds differently): tokens are not comparable"
        if self.divergences and self.unknown_step:
            return f"note: this session does not record which int8 step produced it (unknown); this machine runs " \
                   f"{describe_step(self.step_here)}"
        return None

    @property
    def text_problems(self) -> list[str]:
        """'turn N: ...' for each turn whose text is not what its tokens hold."""
        return [f"turn {t.turn}: {t.text_problem}" for t in self.turns if t.text_problem]

    @property
    def ok(self) -> bool:
        return not self.divergences and not self.step_mismatch and not self.text_problems

    @property
    def n_tokens(self) -> int:
        return sum(len(t.recorded) for t in self.turns)


def replay(chat: Chat, sess: session_files.Session, on_turn=None, on_token=None) -> ReplayReport:
    """Replay `sess` with `chat`'s model (a fresh Chat, autosave off). on_turn(TurnReplay) after each turn;
    on_token(turn, index, token, text, trace, ms) while a turn regenerates."""
    why = other_model(sess, chat.model_name, chat.model_hash)     # before the ids: they are the recording model's
    if why:
        raise ChatError(why)
    session_files.check_tokens(sess, chat.model.cfg.vocab_size, chat.tok, frames_only=True)   # texts: told turn by turn
    msgs = sess.messages
    first = 1 if msgs and msgs[0].role == "system" else 0
    chat.start_replay(sess)
    tok = chat.tok
    turns = []
    try:
        _replay_turns(chat, sess, msgs, first, tok, turns, on_turn, on_token)
    finally:
        chat.steps.use(None)                # the chat's own int8 step again
    return ReplayReport(sess.id, turns, step_here=chat.step_name())


def _replay_turns(chat, sess, msgs, first, tok, turns, on_turn, on_token) -> None:
    """replay's loop: each turn on the int8 step it recorded where this machine has it (quant_steps.py)."""
    for n, i in enumerate(range(first, len(msgs) - 1, 2), start=1):
        user, rec = msgs[i], msgs[i + 1]
        if user.role != "user" or rec.role != "assistant":
            raise ChatError(f"session {sess.id}: message {i} breaks the user/assistant alternation")
        recorded = tok.content_ids(rec.role, rec.token_ids)
        settings = _turn_settings(chat.settings, rec, sess)
        if rec.finish == "cancelled":           # stopped by hand: check the part that was sampled
            settings = dataclasses.replace(settings, max_new=max(1, len(recorded)))
        chat.settings = settings

        def cb(idx, t, text, tr, ms, _n=n):
            if on_token is not None:
                on_token(_n, idx, t, text, tr, ms)

        step = (rec.settings or {}).get("step")
        if not chat.steps.use(step):
            chat.steps.use(None)
        res = chat.replay_turn(user, rec, cb)          # the recorded turn then stands in the history and cache
        out = res.token_ids if rec.finish != "cancelled" else res.token_ids[:len(recorded)]
        div = _first_difference(n, recorded, out, res.probs, tok)
        tr = TurnReplay(n, out, recorded, rec.timing_ms, res.traces, div, step=step, step_here=chat.step_name())
        if not text_matches(rec, tok):
            tr.text_problem = "the reply's text is not what its recorded tokens decode to (edited by hand?)"
        elif not text_matches(user, tok):
            tr.text_problem = "the user message's text is not what its recorded tokens hold (edited by hand?)"
        turns.append(tr)
        if on_turn is not None:
            on_turn(tr)


@dataclass
class BranchReplay:
    label: str               # where the branch forks off ("turn 1 reply 2/3, ..."; "the only path")
    report: ReplayReport


def replay_tree(chat: Chat, sess: session_files.Session, on_turn=None, progress=None) -> list[BranchReplay]:
    """Replay every root-to-leaf path of `sess` (the active path first), each as a session of its own on the same
    chat. on_turn(label, TurnReplay) after each turn; progress(done, total, what) before the first turn and after
    each one, counting the turns of every path (a turn shared by two paths counts in each: each replays it)."""
    out = []
    paths = tree.paths(sess)
    total = sum(sum(m.role == "user" for m in path) for path in paths)
    done = 0

    def tick(what: str) -> None:
        if progress is not None:
            progress(done, total, what)
    tick("replaying")
    for i, path in enumerate(paths):
        label = tree.describe_path(sess, path)
        one = dataclasses.replace(sess, messages=list(path), branches=[])
        where = f"branch {i + 1}/{len(paths)}, " if len(paths) > 1 else ""

        def cb(t, _label=label, _where=where):
            nonlocal done
            done += 1
            tick(f"{_where}turn {t.turn}")
            if on_turn is not None:
                on_turn(_label, t)
        out.append(BranchReplay(label, replay(chat, one, on_turn=cb)))
    return out


def _turn_settings(base: ChatSettings, rec: session_files.Message, sess: session_files.Session) -> ChatSettings:
    if rec.seed is None and (rec.settings or {}).get("seed") is None:
        raise ChatError(f"session {sess.id}: a turn has no recorded seed, it cannot be replayed")
    try:
        return turn_settings(base, rec)
    except ChatError as e:
        raise ChatError(f"session {sess.id}: {e}") from None


def _first_difference(turn, recorded, out, probs, tok) -> Divergence | None:
    for j in range(max(len(recorded), len(out))):
        r = recorded[j] if j < len(recorded) else None
        o = out[j] if j < len(out) else None
        if r == o:
            continue
        p = probs[j] if j < len(probs) else None
        pr = float(p[r]) if p is not None and r is not None and r < p.numel() else None
        po = float(p[o]) if p is not None and o is not None else None
        return Divergence(turn, j, r, o, pr, po, tok.decode([r]) if r is not None else "",
                          tok.decode([o]) if o is not None else "")
    return None
