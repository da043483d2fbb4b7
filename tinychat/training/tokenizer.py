"""``python -m tinychat.training tokenizer``: train the byte-level BPE tokenizer on the corpus.

8192 entries (256 bytes + 3 ChatML specials + merges), GPT-2 byte-level pre-tokenization, trained with HF
``tokenizers`` on the train split only (the validation conversations stay unseen), on the same units the
runtime encodes one by one: each message content, the default system prompt, the role headers.

    python -m tinychat.training tokenizer --shards data/shards --out runs/demo/tokenizer.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tinychat.tokenizer import Tokenizer, train_bpe

from .data import DEFAULT_SYSTEM, corpus_texts, load_split, shards_arg


def build_tokenizer(shards, out: str | Path | None, vocab_size: int = 8192, val_fraction: float = 0.02,
                    system: str = DEFAULT_SYSTEM, min_frequency: int = 2) -> tuple[Tokenizer, dict]:
    train, val = load_split(shards, val_fraction)
    if not train:
        raise SystemExit(f"{shards}: no training conversations")
    t0 = time.perf_counter()
    tok = train_bpe(corpus_texts(train, system), vocab_size, out, min_frequency=min_frequency)
    info = {"vocab_size": tok.vocab_size, "train_conversations": len(train), "val_conversations": len(val),
            "seconds": round(time.perf_counter() - t0, 1), "sha256": tok.sha256}
    return tok, info


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shards", nargs="+", default=["data/shards"], help="shard directories or files")
    p.add_argument("--out", type=Path, default=Path("runs/demo/tokenizer.json"))
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--val-fraction", type=float, default=0.02, help="held out, never seen by the tokenizer")
    p.add_argument("--min-frequency", type=int, default=2)


def run(args) -> int:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tok, info = build_tokenizer(shards_arg(args.shards), args.out, args.vocab_size, args.val_fraction,
                                min_frequency=args.min_frequency)
    print(f"wrote {args.out}: {json.dumps(info)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training tokenizer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
