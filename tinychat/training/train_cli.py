"""``python -m tinychat.training train``: the command line of the training step (train.py's docstring is its
--help): flags, the config a new run takes or a resumed run must match, resume / --end-at / --finish-within,
Ctrl-C and SIGTERM as a checkpoint at the next step boundary."""
from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import torch

from tinychat.tokenizer import Tokenizer

from . import mkl_dispatch, train as T
from .schedule import replan_history
from .data import shards_arg, stats
from .devices import resolve_device
from .train import Trainer, TrainConfig, _hms, latest_checkpoint, load_data


def _kv(text: str):
    k, _, v = text.partition("=")
    if not _:
        raise argparse.ArgumentTypeError("expected KEY=VALUE")
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return v


def _weight(text: str) -> tuple[str, int]:
    """'fact-*=3' -> ("fact-*", 3)."""
    k, eq, v = text.rpartition("=")
    if not eq or not k or not v.isdigit() or int(v) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected KIND=N with N a whole number >= 1 (e.g. fact-*=3)")
    return k, int(v)


def _replan(text: str) -> tuple[int, int]:
    """'100:922' -> (100, 922)."""
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if not m or int(m.group(2)) <= int(m.group(1)):
        raise argparse.ArgumentTypeError(f"{text!r}: expected STEP:END with END after STEP (e.g. 100:922)")
    return int(m.group(1)), int(m.group(2))


def _duration(text: str) -> float:
    """'1h40m', '95m', '30s', '5400' (seconds) -> seconds."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text)
    if not text.strip() or not m or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration (e.g. 1h40m, 95m, 5400)")
    h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
    if h * 3600 + mi * 60 + sec <= 0:
        raise argparse.ArgumentTypeError("a duration must be positive")
    return h * 3600 + mi * 60 + sec


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--shards", nargs="+", default=["data/shards"], help="shard directories or files")
    p.add_argument("--tokenizer", type=Path, default=None, help="tokenizer.json (default: RUN/tokenizer.json)")
    p.add_argument("--run", type=Path, default=Path("runs/demo"), help="run folder (checkpoints, metrics)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu", metavar="cpu|cuda[:N]",
                   help="where the steps run (default cpu); a run may resume on another device (its checkpoints "
                        "live on the CPU), no longer bit-identical from there")
    p.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this many steps")
    p.add_argument("--time-limit", type=float, default=None, help="stop (with a checkpoint) after this many s")
    p.add_argument("--end-at", type=int, default=None, metavar="STEP",
                   help="on resume: anneal to the end of the schedule by this step instead (a cosine from the "
                        "present learning rate), for a run that cannot finish its plan in time")
    p.add_argument("--finish-within", type=_duration, default=None, metavar="DURATION",
                   help="end annealed within this wall time from now (e.g. 1h40m): once past warmup the schedule "
                        "is shortened (as --end-at does) to the steps the measured speed fits, and lengthened again "
                        "(never past its own plan) when steps get faster. For a stage that must end inside a "
                        "working session")
    p.add_argument("--replan", type=_replan, action="append", default=None, metavar="STEP:END",
                   help="at step STEP, re-plan as --end-at END would (repeatable): replays a run's re-plans, those "
                        "--finish-within made included, in one command; a model card's commands use it")
    p.add_argument("--no-resume", action="store_true", help="refuse to continue an existing run")
    p.add_argument("--init", default=None, metavar="MODEL_DIR",
                   help="start a new run from this model folder's weights (e.g. assets), not random ones")
    g = p.add_argument_group("training config (fixed for a run; a resumed run keeps its own)")
    g.add_argument("--size", default=None, help=f"model size (default {d.size})")
    g.add_argument("--set", type=_kv, action="append", default=None, metavar="FIELD=VALUE",
                   help="override a ModelConfig field, e.g. --set n_layers=4")
    for name, typ in (("seq_len", int), ("batch_tokens", int), ("max_rows", int), ("tokens", int), ("steps", int),
                      ("lr", float), ("min_lr_ratio", float), ("warmup", int), ("weight_decay", float),
                      ("clip", float), ("seed", int), ("val_fraction", float)):
        g.add_argument("--" + name.replace("_", "-"), type=typ, default=None,
                       help=f"default {getattr(d, name)}")
    g.add_argument("--weight", type=_weight, action="append", default=None, metavar="KIND=N",
                   help="use the training conversations of this kind (a shard record's \"kind\"; PREFIX* for "
                        "several, e.g. 'fact-*=3') N times an epoch; validation unweighted")
    g.add_argument("--splice", type=_fraction, default=None, metavar="F",
                   help="put one or two opening exchanges of conversations of other kinds in front of this share "
                        "(0-1) of the training conversations, so the student learns to answer a change of subject "
                        "(default 0: none; validation never spliced)")
    g.add_argument("--no-bf16", action="store_true", help="fp32 matmuls (slow)")
    b = p.add_argument_group("bookkeeping (may change on resume)")
    for name in TrainConfig.MUTABLE:
        b.add_argument("--" + name.replace("_", "-"), type=int, default=None, help=f"default {getattr(d, name)}")


def run(args) -> int:
    device = resolve_device(getattr(args, "device", "cpu"), SystemExit)
    torch.set_num_threads(args.threads)
    run_dir: Path = args.run
    run_dir.mkdir(parents=True, exist_ok=True)
    tok_path = args.tokenizer or run_dir / "tokenizer.json"
    tok = Tokenizer.from_file(tok_path)
    if (run_dir / "tokenizer.json").resolve() != Path(tok_path).resolve():
        shutil.copyfile(tok_path, run_dir / "tokenizer.json")
    given = {k: getattr(args, k) for k in ("size", "seq_len", "batch_tokens", "max_rows", "tokens", "steps", "lr",
                                           "min_lr_ratio", "warmup", "weight_decay", "clip", "seed", "val_fraction")
             if getattr(args, k) is not None}
    if args.set:
        given["model_overrides"] = dict(args.set)
    if args.init:
        given["init"] = str(args.init)
    if args.weight:
        given["kind_weights"] = dict(args.weight)
    if args.splice is not None:
        given["splice"] = args.splice
    if args.no_bf16:
        given["bf16"] = False
    book = {k: getattr(args, k) for k in TrainConfig.MUTABLE if getattr(args, k) is not None}
    ck = latest_checkpoint(run_dir)
    if ck is not None:
        if args.no_resume:
            raise SystemExit(f"{run_dir} already holds a run (--no-resume): choose another --run")
        old = TrainConfig.from_dict(json.loads((ck / "state.json").read_text())["config"])
        clash = {k: (getattr(old, k), v) for k, v in given.items() if getattr(old, k) != v}
        if clash:
            raise SystemExit(f"{run_dir} was started with " + ", ".join(f"{k}={a!r}" for k, (a, _) in clash.items())
                             + "; drop those flags to resume it, or start a new --run")
        cfg = old
    else:
        cfg = TrainConfig(**{**TrainConfig().to_dict(), **given, **book})
    t0 = time.perf_counter()
    twice = sorted({s for s in args.shards if args.shards.count(s) > 1})
    if twice:       # split() keeps an exact duplicate conversation once: a folder given twice counts once
        print(f"note: {', '.join(twice)} given more than once: its conversations count once (to weight some, "
              "use --weight KIND=N)", flush=True)
    train, val = load_data(shards_arg(args.shards), tok, cfg.val_fraction, cfg.system_prompt,
                           cache=run_dir / "data.safetensors", weights=cfg.kind_weights, splice=cfg.splice,
                           seed=cfg.seed)
    print(f"data: train {stats(train)} | val {stats(val)} | tokenized in {time.perf_counter() - t0:.1f}s",
          flush=True)
    mkl = mkl_dispatch.describe()
    if mkl:
        print(mkl, flush=True)
    if ck is not None:
        tr = Trainer.resume(run_dir, tok, train, val, overrides=book, device=device)
        print(f"resumed {ck.name}: step {tr.step}/{tr.total_steps}, {tr.tokens_seen:,} tokens seen", flush=True)
        if args.end_at is not None and args.end_at != tr.total_steps:
            tr.end_at(args.end_at)
            print(f"schedule re-planned: cosine from lr {tr.replan['lr']:.2e} at step {tr.step} to the floor at step "
                  f"{tr.total_steps}", flush=True)
    else:
        if args.end_at is not None:
            raise SystemExit("--end-at re-plans a resumed run; a new run is sized by --tokens or --steps")
        tr = Trainer(cfg, tok, train, val, run_dir, device=device)
        print(f"new run {run_dir}: {tr.model.num_params() / 1e6:.2f}M params, {tr.total_steps} steps "
              f"for {cfg.tokens:,} tokens, threads {torch.get_num_threads()}, device {tr.device_log[-1][1]}",
              flush=True)
    replans = dict(args.replan or [])
    done_at = {r["from"] for r in replan_history(tr.replan)}      # a resumed replay's re-plans made already
    early = sorted(st for st in replans if st < cfg.warmup or st < tr.step and st not in done_at)
    if early:
        raise SystemExit(f"--replan {early[0]}:{replans[early[0]]}: " + (
            f"step {early[0]} is inside the warmup ({cfg.warmup} steps)" if early[0] < cfg.warmup
            else f"the run is already at step {tr.step} and was not re-planned there"))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, tr.request_stop)
    rec = tr.fit(stop_after=args.stop_after, time_limit=args.time_limit, replans=replans,
                 finish_within=None if args.finish_within is None else args.finish_within - (time.perf_counter() - t0))
    done = "finished" if tr.step >= tr.total_steps else "stopped (run the same command to resume)"
    print(f"{done} at step {tr.step}/{tr.total_steps}: {tr.tokens_seen:,} tokens in {_hms(tr.elapsed)}, "
          f"{tr.tokens_seen / max(tr.elapsed, 1e-9):,.0f} tok/s, last loss {rec.get('loss', float('nan')):.4f}, "
          "val loss " + (f"{tr.val_loss:.4f}" if tr.val_loss is not None else "not measured yet"), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tinychat.training train", description=T.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
