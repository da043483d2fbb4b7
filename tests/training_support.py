"""Fakes for the training pipeline's tests: conversations, shards, a tiny tokenizer and config."""
from __future__ import annotations

import gzip
import json
import random

from support import _WORDS, make_tokenizer

from tinychat.training import data as D
from tinychat.training.train import TrainConfig

TOK = None


def tok():
    global TOK
    if TOK is None:
        TOK = make_tokenizer()
    return TOK


def fake_conversation(rng: random.Random, turns: int | None = None) -> list[dict]:
    msgs = []
    for _ in range(turns or rng.randint(1, 3)):
        msgs.append({"role": "user", "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8))) + "?"})
        msgs.append({"role": "assistant",
                     "content": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 14))).capitalize() + "."})
    return msgs


def fake_conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    return [fake_conversation(rng) for _ in range(n)]


def write_shards(folder, convs, per_shard: int = 50):
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(0, len(convs), per_shard):
        with gzip.open(folder / f"shard-{s // per_shard:05d}.jsonl.gz", "wt", encoding="utf-8") as f:
            for i, msgs in enumerate(convs[s:s + per_shard]):
                f.write(json.dumps({"id": f"s{s}-{i}", "messages": msgs, "source": "template",
                                    "tokens": {"total": 10, "assistant": 5},
                                    "teacher": {"temperature": 0.8, "top_p": 0.95, "top_k": 64, "max_new": 120,
                                                "seed": 0, "system": "teacher system"}}) + "\n")
    return folder


def exported_card(tmp_path, given: list[str]) -> tuple[dict, str]:
    """Train the tiny model two steps on the shard folders ``given`` and export it with them: (facts, card text)."""
    from tinychat.training.export import export
    from tinychat.training.train import Trainer
    train, val = D.load_split(given, 0.1)
    (tmp_path / "run").mkdir()
    tok().save(tmp_path / "run" / "tokenizer.json")
    Trainer(tiny_cfg(steps=2), tok(), D.encode_all(tok(), train), D.encode_all(tok(), val), tmp_path / "run",
            log=lambda *_: None).fit(progress=False)
    facts = export(tmp_path / "run", tmp_path / "card", None, shards=given, samples=0, log=lambda *_: None)
    return facts, (tmp_path / "card" / "MODEL_CARD.md").read_text()


def tiny_cfg(**kw) -> TrainConfig:
    base = dict(size="tiny", seq_len=96, batch_tokens=384, max_rows=8, steps=6, lr=3e-3, warmup=2, eval_every=0,
                ckpt_every=0, log_every=1000, val_convs=8, seed=1, val_fraction=0.1)
    return TrainConfig(**{**base, **kw})


def tiny_sets(n: int = 40, seed: int = 0):
    train, val = D.split(fake_conversations(n, seed), 0.1)
    return D.encode_all(tok(), train), D.encode_all(tok(), val if val else train[:2])


class CharTok:
    """Stand-in for the teacher's HF tokenizer: one token per character, ids 3.. (0-2 special)."""

    class _Enc:
        def __init__(self, ids):
            self.ids = ids

    def encode(self, s):
        return self._Enc([3 + (ord(c) % 90) for c in s])

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i - 3 + 97) if i >= 3 else "" for i in ids)

    def token_to_id(self, s):
        return 2
