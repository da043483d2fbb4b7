"""The cache timeline of a chat: its one batch-1 KV cache, how the active path got into it, and every way it is moved
(the restore rule in one class).

Feed schedule (what makes restores exact): a turn feeds `pending + user message + generation prompt` with one
`append`, then the decoder steps every sampled token and the stop token (appended too when a turn is cut off or
cancelled). `pending` is what the conversation holds but the cache does not yet: the system message before the
first turn, the newline after each `<|im_end|>`. Rebuilding replays exactly this schedule, each recorded turn on the
int8 step it recorded where this machine has it (quant_steps.py), so the cache comes back bit-identical and the next
turn is token-identical to the uninterrupted chat's.

What it keeps besides the cache: the mark before each turn of the active path (`marks`: None for a turn that
re-prefilled a shortened context, whose mark says nothing; empty after a snapshot restore: unknown), the pending
ids, and the caches of paths the chat switched away from (`left`, branch_cache.py). Cutting back to a turn's mark
and putting a left path back are copies; anything it cannot do by a copy it rebuilds from the token ids."""
from __future__ import annotations

import torch

from ..engine import append
from ..sessions.session import Message, Session
from ..settings import ChatError
from .branch_cache import BranchCache


def first_turn_at(msgs: list[Message]) -> int:
    """The index of the first user message: 1 after a system message, else 0."""
    return 1 if msgs and msgs[0].role == "system" else 0


def turn_of(msgs: list[Message], index: int) -> int:
    """The 0-based turn of the active path's message `index` (a user message or its reply)."""
    start = index if msgs[index].role == "user" else index - 1
    return (start - first_turn_at(msgs)) // 2


def context_ids(msgs: list[Message], start: int, upto: int) -> list[int]:
    """System message + messages[start:upto] ids: a shortened context to re-prefill."""
    sys_ids = msgs[0].token_ids if first_turn_at(msgs) else []
    return sys_ids + [t for m in msgs[start:upto] for t in m.token_ids]


class CacheTimeline:
    """The cache of a chat's active path, with its marks, pending ids and the caches of paths left."""

    def __init__(self, model, cache, decoder, steps, tokenizer, pad_shapes: bool | None = None):
        self.model, self.cache, self.decoder, self.steps, self.tok = model, cache, decoder, steps, tokenizer
        self.pad_shapes = pad_shapes
        self.stop_id = tokenizer.im_end
        self.marks: list[dict | None] = []    # cache mark before each turn (undo / regenerate / switch)
        self.pending: list[int] = []
        self.left = BranchCache()             # the caches of paths this chat switched away from
        self.used_snapshot = False

    # -- feeding ----------------------------------------------------------------------------------------------
    def feed(self, ids: list[int]) -> torch.Tensor:
        """Prefill `ids` with one append; the logits (1, V) after the last. ChatError for an id outside the model's
        vocabulary (the kernels index tables by id)."""
        vocab = self.model.cfg.vocab_size
        if ids and not 0 <= min(ids) <= max(ids) < vocab:
            raise ChatError(f"token id {max(ids) if max(ids) >= 0 else min(ids)} is outside the model's vocabulary "
                            f"(0..{vocab - 1})")
        x = torch.tensor([ids], dtype=torch.long, device=self.cache.gk.device)
        nt, was = self.decoder.prefill_threads(len(ids)), torch.get_num_threads()   # the step's measured count
        if nt is not None:
            torch.set_num_threads(nt)
        try:
            return append(self.model, self.cache, x, [len(ids)], pad_shapes=self.pad_shapes)
        finally:
            if nt is not None:
                torch.set_num_threads(was)

    def length(self) -> int:
        return int(self.cache.lens_cpu[0])

    def content(self, m: Message) -> list[int]:
        """A message's content ids (its frame stripped)."""
        return self.tok.content_ids(m.role, m.token_ids)

    def cached_ids(self, session: Session) -> list[int]:
        """The ids the cache holds: the active path's, less the pending ones."""
        ids = session.context_ids()
        return ids[:len(ids) - len(self.pending)] if self.pending else ids

    def meta(self, session: Session, hash_bytes) -> dict[str, str]:
        """The timeline's part of a KV snapshot's metadata: what the cache holds, what it does not yet."""
        return {"context": hash_bytes(str(self.cached_ids(session)).encode()),
                "pending": ",".join(map(str, self.pending))}

    def turn_done(self, mark: dict | None) -> None:
        """A turn was fed and decoded to its stop token: its mark (None: it re-prefilled a shortened context), and
        the newline after <|im_end|> pending."""
        self.marks.append(mark)
        self.pending = self.tok.end_ids()[1:]

    # -- the restore rule -------------------------------------------------------------------------------------------
    def rebuild(self, session: Session) -> None:
        """Bring the cache to the session's messages by replaying the live feed schedule (bit-exact)."""
        self.cache.reset([0])
        self.used_snapshot = False
        self.marks.clear()
        msgs = session.messages
        pending: list[int] = []
        i = 0
        while i < len(msgs):
            m = msgs[i]
            if m.role == "system":
                pending += m.token_ids
                i += 1
                continue
            if m.role != "user" or i + 1 >= len(msgs) or msgs[i + 1].role != "assistant":
                raise ChatError(f"session {session.id}: message {i} breaks the user/assistant alternation")
            self.pending = pending
            self.play(msgs, i)
            pending = self.pending
            i += 2
        self.pending = pending

    def play(self, msgs: list[Message], at: int) -> None:
        """Feed one recorded turn (msgs[at], msgs[at + 1]) exactly as it ran live: on the int8 step it recorded,
        where this machine has it (quant_steps.py)."""
        user, reply = msgs[at], msgs[at + 1]
        start = (reply.settings or {}).get("context_start")
        mark = self.cache.mark() if start is None else None
        pending = self.pending
        with self.steps.running((reply.settings or {}).get("step")):
            if start is not None:            # this turn re-prefilled a shortened context: do the same
                self.cache.reset([0])
                pending = context_ids(msgs, start, at)
            self.feed(pending + user.token_ids + self.tok.generation_prompt_ids())
            for t in self.content(reply) + [self.stop_id]:
                self.decoder.step(t)
        self.turn_done(mark)

    def load_snapshot(self, session: Session, tensors: dict, meta: dict[str, str], fixed: dict[str, str],
                      hash_bytes) -> bool:
        """Take a KV snapshot's tensors when its metadata is this chat's (`fixed`: the model, mode, device, dtype) and
        this session's context exactly; False (the cache as it was) when not."""
        try:
            self.pending = [int(x) for x in meta.get("pending", "").split(",") if x]
        except ValueError:
            return False
        if any(meta.get(k) != v for k, v in {**fixed, **self.meta(session, hash_bytes)}.items()):
            self.pending = []
            return False
        try:
            self.cache.load_state_dict(tensors)
        except (ValueError, KeyError, RuntimeError):
            self.cache.reset([0])
            self.pending = []
            return False
        self.used_snapshot = True
        self.marks.clear()          # earlier turns' marks are unknown: taking one back rebuilds the cache
        return True

    # -- moving back ------------------------------------------------------------------------------------------------
    def mark_of(self, session: Session, turn: int) -> dict | None:
        """The mark before turn `turn` of the active path; None where it is not known (after a snapshot restore)
        or says nothing (a turn that re-prefilled a shortened context)."""
        return self.marks[turn] if len(self.marks) == session.n_turns else None

    def keep_path(self, session: Session, turn: int) -> dict | None:
        """The active path is about to be left at turn `turn`: keep its cache from that turn's mark on (so switching
        back is a copy). Returns the mark (None: not known; nothing kept)."""
        mark = self.mark_of(session, turn)
        if mark is not None:
            self.left.leave(tuple(m.id for m in session.messages), self.cache, mark, self.marks[turn:], self.pending)
        return mark

    def cut_back(self, session: Session, turn: int, mark: dict | None) -> bool:
        """The cache back to the start of turn `turn` (its mark), the marks and pending ids with it; with no mark
        known, the active path (already cut in the session) rebuilt instead (True)."""
        if mark is None:
            self.rebuild(session)
            return True
        msgs = session.messages
        self.cache.truncate(mark)
        del self.marks[turn:]
        self.pending = self.tok.end_ids()[1:] if turn > 0 else list(msgs[0].token_ids if first_turn_at(msgs) else [])
        return False

    def pop_turn(self, session: Session) -> Message:
        """Take the active path's last turn off the session and the cache; returns its user message."""
        msgs = session.messages
        if len(msgs) < 2 or msgs[-1].role != "assistant":
            raise ChatError("no turn to take back")
        msgs.pop()                          # the reply
        user = msgs.pop()
        mark = self.marks.pop() if self.marks else None
        if mark is None:
            self.rebuild(session)           # a turn that re-prefilled a shortened context, or one from a snapshot
        else:
            self.cache.truncate(mark)
            self.pending = self.tok.end_ids()[1:] if any(m.role == "assistant" for m in msgs) \
                else (msgs[0].token_ids if msgs and msgs[0].role == "system" else [])
        return user

    def take_back(self, mark: dict | None, pending: list[int]) -> None:
        """Undo a turn just run on top of `mark` (None: it re-prefilled: the caller plays the recorded one over the
        reset cache) back to the state it started from (a replay puts the recorded turn in its place)."""
        if mark is not None:
            self.cache.truncate(mark)
        self.marks.pop()
        self.pending = pending

    def switch(self, session: Session, index: int, target: Message, switch_messages) -> None:
        """Activate `target` in place of messages[index] (a reply, or a user message; switch_messages(session, index,
        target) changes the path: tree.switch), moving the cache to the new path: cut back to the mark before that
        turn, then put the new path's part back from what was kept when it was left, or feed its turns as they ran
        live."""
        msgs = session.messages
        start = index if msgs[index].role == "user" else index - 1    # the turn's user message
        turn = turn_of(msgs, index)
        mark = self.mark_of(session, turn)        # before the switch: the path's turns as they were
        left = tuple(m.id for m in msgs)
        switch_messages(session, index, target)
        if mark is None:                         # a shortened-context turn, or marks unknown: rebuild exactly
            self.rebuild(session)
            return
        self.left.leave(left, self.cache, mark, self.marks[turn:], self.pending)
        self.cache.truncate(mark)
        del self.marks[turn:]
        kept = self.left.enter(tuple(m.id for m in msgs), self.cache, mark)
        if kept is not None:                     # a path this chat left earlier: its exact cache, put back
            self.marks += kept[0]
            self.pending = kept[1]
            return
        self.pending = self.tok.end_ids()[1:] if turn > 0 else list(msgs[0].token_ids if first_turn_at(msgs) else [])
        for at in range(start, len(msgs) - 1, 2):
            self.play(msgs, at)
