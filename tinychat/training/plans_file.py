"""Conversation plans in a file: the v2/v3/v4 prompts made here, where their sources are installed (countryinfo,
faker, wordfreq, chitchat-dataset: ~120 MB), and read where the teacher runs, a lent GPU machine that has none of
them. One JSON plan a line, gzipped: {"kind", "source", "turns": [{"text", "check", "dynamic"}, ...]}.

    python -m tinychat.training generate --prompts v4 --seed 10 --write-plans data/plans-10.jsonl.gz --count 60000
    python -m tinychat.training generate --prompts v4 --seed 10 --plans data/plans-10.jsonl.gz --out ... --device cuda

The plans are the stream `generate --prompts v4 --seed 10` itself would draw (questions.plan_stream(seed)), so a
file is made again, byte for byte, by the same command."""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from ..errors import TinychatError
from .questions import Plan, Turn


class PlansError(TinychatError, ValueError):
    """A plans file that cannot be read as one (the CLI's one-line error)."""


def plan_to_dict(p: Plan) -> dict:
    return {"kind": p.kind, "source": p.source,
            "turns": [{"text": t.text, "check": list(t.check), "dynamic": t.dynamic} for t in p.turns]}


def plan_from_dict(d: dict) -> Plan:
    return Plan(d["kind"], tuple(Turn(t["text"], tuple(t.get("check", ())), t.get("dynamic", "")) for t in d["turns"]),
                d["source"])


def write_plans(path: str | Path, plans: Iterable[Plan], count: int) -> int:
    """The first `count` plans into path (atomically: a temp file, then renamed; gzip without a timestamp, so the
    same plans make the same bytes). Returns how many were written."""
    path = Path(path)
    buf, n = io.BytesIO(), 0
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        for p in plans:
            if n >= count:
                break
            gz.write((json.dumps(plan_to_dict(p), ensure_ascii=False) + "\n").encode("utf-8"))
            n += 1
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(buf.getvalue())
    os.replace(tmp, path)
    return n


def read_plans(path: str | Path) -> Iterator[Plan]:
    """The plans of a file, in order; a line that is not a plan is a PlansError naming the line."""
    if not Path(path).is_file():
        raise PlansError(f"{path}: no such plans file (write one with --write-plans)")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                yield plan_from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
                raise PlansError(f"{path}:{i}: not a conversation plan ({type(e).__name__}: {e})") from None


def file_meta(path: str | Path) -> dict:
    """What a record says of the plans file it came from."""
    return {"file": Path(path).name, "sha256": hashlib.sha256(Path(path).read_bytes()).hexdigest()}
