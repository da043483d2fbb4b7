"""Training data: shards -> held-out split -> ChatML token ids with an assistant-only loss mask -> batches.

Shards are what ``generate`` writes: ``*.jsonl.gz`` (or plain ``*.jsonl``), one conversation per line with
``"messages": [{"role": "user"|"assistant", "content": ...}, ...]``. Everything here is deterministic:

- Split: a conversation is validation when a hash of its messages falls under ``val_fraction`` (~2 %), so the
  split does not depend on shard order or count, and identical conversations always land on the same side.
- Encoding: every conversation starts with the app's default system prompt (what every chat starts with), then
  its messages exactly as the runtime lays them out (``Tokenizer.format_messages``). System messages inside a
  record are dropped: the system prompt is the caller's choice, one for all.
- Loss mask (on targets): 1 on the content tokens of each assistant message and the ``<|im_end|>`` that closes
  it; 0 on the system and user messages, every ``<|im_start|>role\\n`` frame, the newline after each
  ``<|im_end|>`` (the runtime feeds that newline; the model never samples it) and padding.
- Batches: whole conversations, right-padded, truncated at ``seq_len``; conversations of similar length go
  together (sorted inside shuffled pools) under a token budget, and the batch order is shuffled. The plan of
  epoch ``e`` is a pure function of (seed, e), which is what makes a resumed run read the same batches.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from tinychat.tokenizer import Tokenizer
from ..errors import TinychatError

DEFAULT_SYSTEM = "You are a helpful assistant."     # = tinychat.chat.ChatSettings().system_prompt (tested)
PAD_ID = 0                                          # <|endoftext|>; padding is never a target (mask 0)


class DataError(TinychatError, ValueError):
    """Shards that cannot be read as conversations; one line, fit for the user."""


# -- shards -------------------------------------------------------------------------------------------------------

def shard_files(source: str | Path | Sequence[str | Path]) -> list[Path]:
    """A shard directory (its ``*.jsonl.gz`` and ``*.jsonl`` files, sorted by name), a shard file, or a sequence of
    them (in that order)."""
    if not isinstance(source, (str, Path)):
        return [f for s in source for f in shard_files(s)]
    p = Path(source)
    if p.is_dir():
        files = sorted(q for q in p.iterdir()
                       if q.is_file() and q.name.endswith((".jsonl.gz", ".jsonl")) and not q.name.startswith("."))
        if not files:
            raise DataError(f"{p}: no *.jsonl.gz shards")
        return files
    if not p.is_file():
        raise DataError(f"{p}: no such shard file or directory")
    return [p]


def shards_arg(values: Sequence[str]) -> str | list[str]:
    """The value of a ``--shards DIR|FILE [...]`` option: one path as it is, several as a list."""
    return values[0] if len(values) == 1 else list(values)


def read_conversations(source, kinds: bool = False) -> Iterator:
    """Yield each conversation's messages ([{"role", "content"}, ...]) from the shards, in file order; with kinds,
    (kind, messages) pairs (the record's "kind", "" when it has none)."""
    for path in shard_files(source):
        opener = gzip.open if path.name.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8") as f:
                for n, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{n}: not JSON ({e})") from None
                    msgs = _messages(rec, f"{path}:{n}")
                    yield (str(rec.get("kind") or ""), msgs) if kinds else msgs
        except (OSError, EOFError) as e:
            raise DataError(f"{path}: unreadable shard ({e})") from None


def teacher_meta(source) -> dict:
    """The generation settings recorded with the first conversation ({} when the shards record none)."""
    for path in shard_files(source):
        opener = gzip.open if path.name.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    return dict(rec.get("teacher") or {}) if isinstance(rec, dict) else {}
    return {}


def _messages(rec, where: str) -> list[dict]:
    msgs = rec.get("messages") if isinstance(rec, dict) else None
    if not isinstance(msgs, list):
        raise DataError(f"{where}: record has no 'messages' list")
    out = []
    for m in msgs:
        if not (isinstance(m, dict) and isinstance(m.get("content"), str)
                and m.get("role") in ("system", "user", "assistant")):
            raise DataError(f"{where}: bad message {str(m)[:80]!r}")
        if m["role"] != "system":
            out.append({"role": m["role"], "content": m["content"]})
    return out


# -- split --------------------------------------------------------------------------------------------------------

def conversation_hash(messages: Sequence[dict]) -> str:
    """sha256 of the conversation's roles and contents (nothing else: ids and metadata do not move it)."""
    canon = json.dumps([[m["role"], m["content"]] for m in messages], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canon.encode("utf-8")).hexdigest()


def is_validation(messages: Sequence[dict], val_fraction: float = 0.02) -> bool:
    return int(conversation_hash(messages)[:16], 16) < val_fraction * 2.0 ** 64


def split(conversations: Iterable, val_fraction: float = 0.02, messages=None) -> tuple[list, list]:
    """(train, validation) lists, each in input order; exact duplicates are kept once. messages: the item's
    messages when the items are not the message lists themselves (e.g. (kind, messages) pairs)."""
    train, val, seen = [], [], set()
    for item in conversations:
        msgs = item if messages is None else messages(item)
        if not any(m["role"] == "assistant" for m in msgs):
            continue
        h = conversation_hash(msgs)
        if h in seen:
            continue
        seen.add(h)
        (val if int(h[:16], 16) < val_fraction * 2.0 ** 64 else train).append(item)
    return train, val


def kind_weight(kind: str, weights: dict | None) -> int:
    """How many times a training conversation of this kind is used an epoch: the weight of the first pattern that
    matches it ("fact-*" matches every kind starting "fact-"), else 1."""
    for pat, w in (weights or {}).items():
        if kind == pat or (pat.endswith("*") and kind.startswith(pat[:-1])):
            return int(w)
    return 1


def load_split(source, val_fraction: float = 0.02, weights: dict | None = None, splice: float = 0.0,
               seed: int = 0) -> tuple[list, list]:
    """(train, val) as split() makes them; weights {KIND or PREFIX*: N} then repeat the training conversations of
    those kinds N times an epoch (each copy appended after the originals, so the batcher's shuffled pools mostly
    put the copies in different batches); splice: that share of the training conversations, copies included (each
    drawn on its own), get an unrelated opening exchange or two in front (splice.py). Validation is never weighted
    or spliced: its loss stays one number per conversation, comparable between runs."""
    if not weights and not splice:
        return split(read_conversations(source), val_fraction)
    train, val = split(read_conversations(source, kinds=True), val_fraction, messages=lambda pair: pair[1])
    train = train + [(kind, m) for kind, m in train for _ in range(kind_weight(kind, weights) - 1)]
    if splice:
        from .splice import splice_conversations
        train = splice_conversations(train, splice, seed)
    return [m for _, m in train], [m for _, m in val]


def corpus_texts(conversations: Iterable[list[dict]], system: str = DEFAULT_SYSTEM) -> Iterator[str]:
    """The strings the tokenizer encodes one by one: every message content, the system prompt and the role
    headers (the runtime encodes each of these separately, so BPE is trained on the same units)."""
    yield from ("system\n", "user\n", "assistant\n", "\n", system)
    for msgs in conversations:
        for m in msgs:
            yield m["content"]


# -- encoding -----------------------------------------------------------------------------------------------------

def encode_conversation(tok: Tokenizer, messages: Sequence[dict], system: str = DEFAULT_SYSTEM,
                        contents: Sequence[list[int]] | None = None) -> tuple[list[int], list[int]]:
    """ChatML ids of [system] + messages (= tok.format_messages(..., add_generation_prompt=False)) and a mask of
    the same length: 1 where the token is assistant content or the <|im_end|> closing an assistant message.
    contents: the messages' content ids when already encoded (a batch encode is faster)."""
    ids: list[int] = []
    mask: list[int] = []
    if system:
        part = tok.message_ids("system", system)
        ids += part
        mask += [0] * len(part)
    end = tok.end_ids()                                     # <|im_end|> \n
    for i, m in enumerate(messages):
        head = tok.header_ids(m["role"])
        body = contents[i] if contents is not None else tok.encode(m["content"])
        ids += head + body + end
        on = 1 if m["role"] == "assistant" else 0
        mask += [0] * len(head) + [on] * len(body) + [on] + [0] * (len(end) - 1)
    return ids, mask


@dataclass
class TokenizedSet:
    """Conversations as one flat id tensor: conversation i is ids[offsets[i]:offsets[i + 1]] with its mask."""
    ids: torch.Tensor           # (N,) int32
    mask: torch.Tensor          # (N,) bool: this token is a loss target (assistant content / closing im_end)
    offsets: torch.Tensor       # (n + 1,) int64

    def __len__(self) -> int:
        return self.offsets.numel() - 1

    @cached_property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def n_tokens(self) -> int:
        return int(self.ids.numel())

    @property
    def n_target_tokens(self) -> int:
        return int(self.mask.sum())

    def fingerprint(self) -> str:
        """sha256 over ids, mask and offsets: a resumed run checks it reads the same data."""
        h = hashlib.sha256()
        for t in (self.ids, self.mask.to(torch.uint8), self.offsets):
            h.update(t.contiguous().numpy().tobytes())
        return h.hexdigest()

    def subset(self, n: int) -> "TokenizedSet":
        """The first n conversations."""
        n = min(n, len(self))
        end = int(self.offsets[n])
        return TokenizedSet(self.ids[:end], self.mask[:end], self.offsets[:n + 1].clone())

    def row(self, i: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Conversation i truncated to seq_len + 1 tokens: (ids, mask)."""
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        b = min(b, a + seq_len + 1)
        return self.ids[a:b], self.mask[a:b]

    def collate(self, rows: Sequence[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(idx, targets, mask), each (B, T) with T = the longest row (<= seq_len): idx = tokens[:-1],
        targets = tokens[1:], mask = the targets' loss mask; right padding is PAD_ID with mask 0."""
        parts = [self.row(i, seq_len) for i in rows]
        T = max(len(p[0]) for p in parts) - 1
        idx = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
        tgt = torch.full((len(rows), T), PAD_ID, dtype=torch.long)
        msk = torch.zeros((len(rows), T), dtype=torch.bool)
        for r, (ids, m) in enumerate(parts):
            n = len(ids) - 1
            idx[r, :n] = ids[:-1]
            tgt[r, :n] = ids[1:]
            msk[r, :n] = m[1:]
        return idx, tgt, msk

    def plan(self, batch_tokens: int, seq_len: int, seed: int, epoch: int, max_rows: int = 64,
             pool: int = 64) -> list[list[int]]:
        """Epoch `epoch`'s batches as lists of conversation indices (a pure function of the arguments).
        Conversations are shuffled, sorted by length inside pools of about `pool` batches, cut into batches
        whose padded size rows * longest stays within batch_tokens (and <= max_rows rows), and the batches
        are shuffled. Every conversation appears exactly once per epoch."""
        n = len(self)
        if n == 0:
            return []
        rng = random.Random(f"tinychat-plan:{seed}:{epoch}")
        order = list(range(n))
        rng.shuffle(order)
        lens = (self.lengths.clamp(max=seq_len + 1) - 1).clamp(min=1).tolist()
        avg = max(1, sum(lens) // n)
        pool_size = max(1, pool * max(1, batch_tokens // avg))
        batches: list[list[int]] = []
        for s in range(0, n, pool_size):
            chunk = sorted(order[s:s + pool_size], key=lambda i: lens[i])
            cur: list[int] = []
            longest = 0
            for i in chunk:
                L = max(longest, lens[i])
                if cur and (L * (len(cur) + 1) > batch_tokens or len(cur) >= max_rows):
                    batches.append(cur)
                    cur, L = [], lens[i]
                cur.append(i)
                longest = L
            if cur:
                batches.append(cur)
        rng.shuffle(batches)
        return batches


def encode_all(tok: Tokenizer, conversations: Sequence[list[dict]], system: str = DEFAULT_SYSTEM,
               chunk: int = 2000) -> TokenizedSet:
    """Tokenize conversations into a TokenizedSet. Message contents go through one batch encode per chunk of
    conversations (fast, and the Rust side's per-token Encoding objects never pile up for the whole corpus)."""
    specials = tok._special_re                              # contents holding special-token text: slow path
    ids_parts, mask_parts, lengths = [], [], []
    for s in range(0, len(conversations), chunk):
        part = conversations[s:s + chunk]
        flat = [m["content"] for msgs in part for m in msgs]
        fast = [c for c in flat if not specials.search(c)]
        enc = iter([e.ids for e in tok.hf.encode_batch(fast, add_special_tokens=False)] if fast else [])
        content_ids = [tok.encode(c) if specials.search(c) else next(enc) for c in flat]
        ids: list[int] = []
        mask: list[int] = []
        k = 0
        for msgs in part:
            i, m = encode_conversation(tok, msgs, system, contents=content_ids[k:k + len(msgs)])
            k += len(msgs)
            ids += i
            mask += m
            lengths.append(len(i))
        ids_parts.append(torch.tensor(ids, dtype=torch.int32))
        mask_parts.append(torch.tensor(mask, dtype=torch.bool))
    offsets = torch.zeros(len(lengths) + 1, dtype=torch.long)
    if lengths:
        offsets[1:] = torch.tensor(lengths, dtype=torch.long).cumsum(0)
    def cat(ps, dt):
        return torch.cat(ps) if ps else torch.zeros(0, dtype=dt)
    return TokenizedSet(cat(ids_parts, torch.int32), cat(mask_parts, torch.bool), offsets)


def cache_key(tok: Tokenizer, source, val_fraction: float, system: str, weights: dict | None = None,
              splice: float = 0.0, seed: int = 0) -> str:
    """What a tokenized-data cache depends on: tokenizer, split, system prompt, kind weights, splicing and the shard
    files' stats."""
    files = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in shard_files(source)]
    blob = json.dumps([tok.sha256, val_fraction, system, files] + ([sorted(weights.items())] if weights else [])
                      + ([["splice", splice, seed]] if splice else []))
    return hashlib.sha256(blob.encode()).hexdigest()


def load_tokenized(source, tok: Tokenizer, val_fraction: float = 0.02, system: str = DEFAULT_SYSTEM,
                   cache: str | Path | None = None, weights: dict | None = None, splice: float = 0.0,
                   seed: int = 0) -> tuple[TokenizedSet, TokenizedSet]:
    """(train, val) TokenizedSets from the shards (weights, splice, seed: load_split's). cache: a .safetensors file
    reused while the tokenizer, split, system prompt, weights, splicing and shard files are unchanged (re-tokenizing
    a big corpus takes minutes); no pickle."""
    from safetensors.torch import load_file, save_file
    key = cache_key(tok, source, val_fraction, system, weights, splice, seed) if cache else None
    if cache and Path(cache).is_file():
        from safetensors import safe_open
        try:
            with safe_open(str(cache), "pt") as f:
                hit = (f.metadata() or {}).get("key") == key
            if hit:
                t = load_file(str(cache))
                return tuple(TokenizedSet(t[f"{n}.ids"], t[f"{n}.mask"], t[f"{n}.offsets"])   # type: ignore
                             for n in ("train", "val"))
        except Exception:  # noqa: BLE001  a damaged cache is only a lost shortcut
            pass
    train, val = load_split(source, val_fraction, weights, splice, seed)
    sets = encode_all(tok, train, system), encode_all(tok, val, system)
    if cache:
        tensors = {f"{n}.{f}": getattr(ts, f).contiguous() for n, ts in zip(("train", "val"), sets)
                   for f in ("ids", "mask", "offsets")}
        tmp = Path(cache).with_name(f".{Path(cache).name}.tmp")
        save_file(tensors, str(tmp), metadata={"key": key})
        tmp.replace(cache)
    return sets


def stats(ts: TokenizedSet) -> dict:
    lens = ts.lengths.float()
    return {"conversations": len(ts), "tokens": ts.n_tokens, "target_tokens": ts.n_target_tokens,
            "mean_len": round(float(lens.mean()), 1) if len(ts) else 0.0,
            "max_len": int(lens.max()) if len(ts) else 0}
