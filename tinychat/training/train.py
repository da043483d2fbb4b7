"""``python -m tinychat.training train``: train the student TinyAgentLM on the teacher's conversations.

The `demo` model (with Engram; its cid_map built from the tokenizer), cross-entropy on assistant tokens only
(content + the closing <|im_end|>, see data.py; the fused head + loss in loss.py), AdamW (no decay on embeddings and Engram tables), linear
warmup then cosine decay to min_lr, bf16 autocast on CPU (fp32 master weights), gradient clipping, a held-out
validation loss every --eval-every steps, and a progress line with loss, val loss, tok/s and ETA.

Checkpoints (no pickle anywhere): RUN/checkpoints/step-NNNNNNN/ holds model.safetensors (fp32 weights and
buffers), optim.safetensors (AdamW's step / exp_avg / exp_avg_sq per parameter, by parameter name, plus the
torch RNG state) and state.json (step, data position, schedule, config, data and tokenizer fingerprints). A
checkpoint is written into a temp folder and renamed; RUN/LATEST (itself replaced atomically) names the newest.
Running the same command again resumes from LATEST and continues exactly as if never stopped (same batches,
same optimizer state, bit-identical parameters at a given thread count). Ctrl-C or SIGTERM saves a checkpoint
at the next step boundary, then exits.

    python -m tinychat.training train --shards data/shards --tokenizer runs/demo/tokenizer.json --run runs/demo

The command line (flags, resume rules, signals) is train_cli.py; this module is the Trainer and its schedule.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tinychat.model import TinyAgentLM, config_for
from tinychat.engine.quant import release_freed_memory
from tinychat.fsutil import atomic_write_bytes, file_sha256, fsync_dir
from tinychat.tokenizer import Tokenizer

from .data import DEFAULT_SYSTEM, TokenizedSet, load_tokenized, stats
from .loss import masked_loss
from .schedule import lr_at, replan_history

CKPT_FORMAT = 1


@dataclass
class TrainConfig:
    size: str = "demo"
    model_overrides: dict = field(default_factory=dict)   # ModelConfig fields over the named size
    seq_len: int = 1024             # tokens per row (longer conversations are truncated)
    batch_tokens: int = 12288       # padded rows * length per batch, at most
    max_rows: int = 64
    tokens: int = 20_000_000        # training tokens (non-padding inputs) the schedule is sized for
    steps: int = 0                  # > 0: this many steps instead of sizing from `tokens`
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    clip: float = 1.0
    seed: int = 0
    bf16: bool = True
    val_fraction: float = 0.02
    system_prompt: str = DEFAULT_SYSTEM
    init: str = ""                  # a model folder (e.g. assets) to start from instead of random weights
    kind_weights: dict = field(default_factory=dict)    # {KIND or PREFIX*: N}: those conversations N times an epoch
    splice: float = 0.0             # this share of training conversations gets unrelated openings in front (splice.py)
    # bookkeeping only (may change between resumes without changing the result)
    eval_every: int = 250
    val_convs: int = 200            # periodic validation on the first this-many held-out conversations
    ckpt_every: int = 250
    keep: int = 2
    log_every: int = 10

    MUTABLE = ("eval_every", "val_convs", "ckpt_every", "keep", "log_every")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def model_config(self):
        return config_for(self.size, **self.model_overrides)


def _param_groups(model: TinyAgentLM, weight_decay: float):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.startswith("embed.") or name.endswith("table.weight") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    run_dir = Path(run_dir)
    ptr = run_dir / "LATEST"
    if not ptr.is_file():
        return None
    ck = run_dir / "checkpoints" / ptr.read_text().strip()
    if not (ck / "state.json").is_file():
        raise SystemExit(f"{ptr} names {ck}, which is not a complete checkpoint")
    return ck


class Trainer:
    def __init__(self, cfg: TrainConfig, tok: Tokenizer, train: TokenizedSet, val: TokenizedSet,
                 run_dir: str | Path, total_steps: int | None = None, log=print, device: str = "cpu"):
        self.cfg, self.tok, self.train, self.val = cfg, tok, train, val
        # where the steps run (like the thread count, not part of the config: a run may move between them, the
        # checkpoints stay on the CPU); a GPU run is not bit-identical to a CPU one
        self.device = torch.device(device)
        self.run_dir = Path(run_dir)
        self.log = log
        torch.manual_seed(cfg.seed)
        mcfg = cfg.model_config()
        if tok.vocab_size > mcfg.vocab_size:
            raise SystemExit(f"tokenizer has {tok.vocab_size} entries, the {cfg.size} model only {mcfg.vocab_size}")
        self.model = TinyAgentLM(mcfg)
        self.model.reset_parameters(cfg.seed)
        self.init_sha256 = ""
        if cfg.init:
            self._load_init(cfg.init, mcfg)
        self.model.set_token_strings(tok.token_strings())
        self.model.to(self.device)
        self.model.train()
        self.opt = torch.optim.AdamW(_param_groups(self.model, cfg.weight_decay), lr=cfg.lr,
                                     betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                                     fused=self.device.type == "cuda" or None)
        self.step = 0
        self.epoch, self.pos = 0, 0             # next batch: plan(epoch)[pos]
        self.tokens_seen = self.targets_seen = 0
        self.elapsed = 0.0                      # training wall time over all sessions (s)
        self.val_loss: float | None = None
        self.val_full = False                   # val_loss is over the whole held-out split (else a subset)
        self.threads_log = [[0, torch.get_num_threads()]]   # [from step, threads] per stretch of the run
        self.device_log = [[0, device_name(self.device)]]   # [from step, device] likewise
        self._plan: tuple[int, list] | None = None
        self.total_steps = total_steps or cfg.steps or self.steps_for_tokens()
        self.replan: dict | None = None       # end_at's new end of the schedule (lr_at)
        self._stop = False

    def _load_init(self, path: str, mcfg) -> None:
        """Start from a saved model's weights (its config must be this run's); the optimizer starts fresh."""
        from tinychat.model_config import CheckpointError, load_config
        try:
            cfg = load_config(path)
            if cfg.to_dict() != mcfg.to_dict():
                diff = {k: (v, mcfg.to_dict()[k]) for k, v in cfg.to_dict().items() if mcfg.to_dict().get(k) != v}
                raise SystemExit(f"--init {path}: its model differs from this run's ({diff}); "
                                 "pass --size / --set to match it")
            src = TinyAgentLM.from_pretrained(path)
        except CheckpointError as e:
            raise SystemExit(f"--init {path}: {e}") from None
        self.model.load_state_dict(src.state_dict(), strict=True)
        self.init_sha256 = file_sha256(Path(path) / "model.safetensors")    # the card names what it started from

    # -- data order ---------------------------------------------------------------------------------------------
    def plan(self, epoch: int) -> list[list[int]]:
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, self.train.plan(self.cfg.batch_tokens, self.cfg.seq_len, self.cfg.seed, epoch,
                                                 self.cfg.max_rows))
        return self._plan[1]

    def steps_for_tokens(self) -> int:
        p = self.plan(0)
        per_epoch = int((self.train.lengths.clamp(max=self.cfg.seq_len + 1) - 1).sum())
        return max(1, math.ceil(self.cfg.tokens / max(1.0, per_epoch / max(1, len(p)))))

    def next_batch(self) -> list[int]:
        p = self.plan(self.epoch)
        if self.pos >= len(p):
            self.epoch, self.pos = self.epoch + 1, 0
            p = self.plan(self.epoch)
        rows = p[self.pos]
        self.pos += 1
        return rows

    # -- one step -----------------------------------------------------------------------------------------------
    def train_step(self) -> dict:
        t0 = time.perf_counter()
        rows = self.next_batch()
        idx, tgt, msk = (t.to(self.device, non_blocking=True) for t in self.train.collate(rows, self.cfg.seq_len))
        lr = lr_at(self.step, self.cfg, self.total_steps, self.replan)
        for g in self.opt.param_groups:
            g["lr"] = lr
        loss_sum, n = masked_loss(self.model, idx, tgt, msk, self.cfg.bf16)
        loss = loss_sum / max(n, 1)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.clip)
        self.opt.step()
        self.step += 1
        ntok = sum(min(int(self.train.lengths[i]), self.cfg.seq_len + 1) - 1 for i in rows)
        self.tokens_seen += ntok
        self.targets_seen += n
        dt = time.perf_counter() - t0
        self.elapsed += dt
        return {"step": self.step, "loss": loss.item(), "lr": lr, "gnorm": gnorm.item(), "tokens": ntok,
                "targets": n, "seconds": dt, "rows": idx.shape[0], "T": idx.shape[1]}

    @torch.no_grad()
    def evaluate(self, data: TokenizedSet | None = None, max_convs: int | None = None) -> float:
        """Mean loss per assistant target token over held-out conversations (length-sorted batches)."""
        data = self.val if data is None else data
        if max_convs:
            data = data.subset(max_convs)
        if len(data) == 0:
            return float("nan")
        order = sorted(range(len(data)), key=lambda i: int(data.lengths[i]))
        total, count, cur = 0.0, 0, []
        was = self.model.training
        self.model.eval()

        def flush(rows):
            nonlocal total, count
            batch = (t.to(self.device) for t in data.collate(rows, self.cfg.seq_len))
            s, n = masked_loss(self.model, *batch, self.cfg.bf16)
            total += float(s)
            count += n
        for i in order:
            L = min(int(data.lengths[i]), self.cfg.seq_len + 1)
            if cur and L * (len(cur) + 1) > 2 * self.cfg.batch_tokens:
                flush(cur)
                cur = []
            cur.append(i)
        if cur:
            flush(cur)
        self.model.train(was)
        return total / max(count, 1)

    # -- checkpoints --------------------------------------------------------------------------------------------
    def state(self) -> dict:
        return {"format": CKPT_FORMAT, "step": self.step, "epoch": self.epoch, "pos": self.pos,
                "total_steps": self.total_steps, "tokens_seen": self.tokens_seen, "targets_seen": self.targets_seen,
                "elapsed_s": round(self.elapsed, 3), "val_loss": self.val_loss, "val_full": self.val_full, "lr": lr_at(max(self.step - 1, 0),
                self.cfg, self.total_steps, self.replan), **({"replan": self.replan} if self.replan else {}), "threads": torch.get_num_threads(), "threads_log": self.threads_log,
                **({"device_log": self.device_log} if self.device_log != [[0, "cpu"]] else {}),
                "config": self.cfg.to_dict(),
                "model_config": self.model.cfg.to_dict(), "tokenizer_sha256": self.tok.sha256,
                **({"init_sha256": self.init_sha256} if self.init_sha256 else {}),
                "data": {"train": {**stats(self.train), "fingerprint": self.train.fingerprint()},
                         "val": {**stats(self.val), "fingerprint": self.val.fingerprint()}},
                "params": self.model.num_params(), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    def optimizer_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for name, p in self.model.named_parameters():
            st = self.opt.state.get(p)
            if not st:
                continue
            for k in ("step", "exp_avg", "exp_avg_sq"):
                v = st[k]
                v = v if torch.is_tensor(v) else torch.tensor(float(v))
                out[f"{name}.{k}"] = v.detach().to("cpu", copy=True).contiguous()
        out["rng.torch"] = torch.get_rng_state().clone()
        return out

    def save_checkpoint(self) -> Path:
        from safetensors.torch import save_file
        ck_root = self.run_dir / "checkpoints"
        ck_root.mkdir(parents=True, exist_ok=True)
        name = f"step-{self.step:07d}"
        final = ck_root / name
        tmp = ck_root / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        weights = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.model.state_dict().items()}
        save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        save_file(self.optimizer_tensors(), str(tmp / "optim.safetensors"), metadata={"format": "pt"})
        (tmp / "state.json").write_text(json.dumps(self.state(), indent=2))
        for f in tmp.iterdir():
            with open(f, "rb+") as fh:
                os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        fsync_dir(ck_root)
        atomic_write_bytes(self.run_dir / "LATEST", name.encode())
        self._prune(ck_root, keep=name)
        return final

    def _prune(self, ck_root: Path, keep: str) -> None:
        done = sorted(p for p in ck_root.iterdir() if p.is_dir() and p.name.startswith("step-"))
        for p in done[:-max(1, self.cfg.keep)]:
            if p.name != keep:
                shutil.rmtree(p, ignore_errors=True)

    def load_checkpoint(self, ck: Path) -> None:
        from safetensors.torch import load_file
        state = json.loads((ck / "state.json").read_text())
        self.model.load_state_dict(load_file(str(ck / "model.safetensors"), device=str(self.device)), strict=True)
        tensors = load_file(str(ck / "optim.safetensors"))
        sd = self.opt.state_dict()
        index = {}
        for gsd, group in zip(sd["param_groups"], self.opt.param_groups):
            for i, p in zip(gsd["params"], group["params"]):
                index[id(p)] = i
        sd["state"] = {}
        for name, p in self.model.named_parameters():
            if f"{name}.exp_avg" in tensors:
                sd["state"][index[id(p)]] = {k: tensors[f"{name}.{k}"] for k in ("step", "exp_avg", "exp_avg_sq")}
        self.opt.load_state_dict(sd)
        torch.set_rng_state(tensors["rng.torch"])
        self.step, self.epoch, self.pos = state["step"], state["epoch"], state["pos"]
        self.total_steps = state["total_steps"]
        self.tokens_seen, self.targets_seen = state["tokens_seen"], state["targets_seen"]
        self.elapsed, self.val_loss = state["elapsed_s"], state["val_loss"]
        self.threads_log = _continued(state.get("threads_log") or [[0, state.get("threads")]], self.step,
                                      torch.get_num_threads())
        self.device_log = _continued(state.get("device_log") or [[0, "cpu"]], self.step, device_name(self.device))
        self.val_full = state.get("val_full", False)
        self.init_sha256 = state.get("init_sha256", self.init_sha256)   # (older runs: the folder as it is now)
        self.replan = state.get("replan")

    @classmethod
    def resume(cls, run_dir, tok: Tokenizer, train: TokenizedSet, val: TokenizedSet, log=print,
               overrides: dict | None = None, device: str = "cpu") -> "Trainer":
        """A trainer at RUN's newest checkpoint. overrides: bookkeeping fields (TrainConfig.MUTABLE) to change."""
        ck = latest_checkpoint(run_dir)
        if ck is None:
            raise SystemExit(f"{run_dir}: no checkpoint to resume")
        state = json.loads((ck / "state.json").read_text())
        if state.get("format") != CKPT_FORMAT:
            raise SystemExit(f"{ck}: checkpoint format {state.get('format')}, expected {CKPT_FORMAT}")
        cfg = TrainConfig.from_dict(state["config"])
        if overrides:
            cfg = dataclasses.replace(cfg, **{k: v for k, v in overrides.items() if k in TrainConfig.MUTABLE})
        if state["tokenizer_sha256"] != tok.sha256:
            raise SystemExit(f"{ck} was trained with another tokenizer")
        for part, ds in (("train", train), ("val", val)):
            if state["data"][part]["fingerprint"] != ds.fingerprint():
                raise SystemExit(f"{ck}: the {part} data differ from those the run started with "
                                 f"({state['data'][part]['conversations']} conversations then, {len(ds)} now)")
        tr = cls(cfg, tok, train, val, run_dir, total_steps=state["total_steps"], log=log, device=device)
        tr.load_checkpoint(ck)
        if state.get("threads") != torch.get_num_threads():
            log(f"note: run started with {state.get('threads')} threads, now {torch.get_num_threads()}: "
                "results stay valid but are no longer bit-identical to an uninterrupted run")
        return tr

    # -- the loop -----------------------------------------------------------------------------------------------
    def end_at(self, end: int) -> None:
        """End the schedule at step `end` instead (a run that cannot finish its plan in the time it has): from the
        current step the learning rate follows a cosine from its present value down to the floor at `end`, so
        the run still anneals. Recorded in the checkpoints (and the card); later resumes keep it."""
        if end <= self.step:
            raise SystemExit(f"--end-at {end}: the run is already at step {self.step}")
        if self.step < self.cfg.warmup:
            raise SystemExit(f"--end-at: the run is still warming up (step {self.step} of {self.cfg.warmup})")
        self.replan = {"from": self.step, "lr": lr_at(self.step, self.cfg, self.total_steps, self.replan),
                       "end": end, "planned": self.total_steps, **({"prev": self.replan} if self.replan else {})}
        self.total_steps = end

    FIT_PROBE, FIT_MARGIN, FIT_SLACK, FIT_WINDOW = 20, 0.95, 0.02, 30
    FIT_GROW = 0.10         # lengthen only past this: the margin alone lets the fit creep up ~5 % near the end

    def planned_steps(self) -> int:
        """The schedule's length before any re-plan (the config's plan)."""
        first = replan_history(self.replan)
        return first[0]["planned"] if first else self.total_steps

    def fit_deadline(self, start_step: int, used: float, budget: float, per_step: float | None = None) -> int | None:
        """Fit the schedule to end inside `budget` seconds, `used` of them gone since start_step (the step this
        process began at): every 10 steps once past warmup and FIT_PROBE steps into this process, the steps that
        still fit (FIT_MARGIN of the time left, for evaluations and the last checkpoint, at `per_step` seconds a
        step: fit() passes the median of the last FIT_WINDOW steps, so a stall (a paused job, a machine busy for a
        while) costs the time it took and no more; else this process's mean) are compared with the plan; when they
        fall short by more than FIT_SLACK of it, end_at() re-plans to end there. When steps got faster (a busy
        machine freed, a GPU past its first shapes) and more than FIT_GROW more fit than the plan holds, it
        lengthens again, never past the config's own plan (planned_steps). Returns the new end step, None when
        unchanged."""
        done = self.step - start_step
        if (self.step < self.cfg.warmup or done < self.FIT_PROBE or done % 10 or self.step >= self.total_steps
                or used <= 0):
            return None
        per_step = used / done if per_step is None or per_step <= 0 else per_step
        fit = self.step + max(1, int((budget - used) * self.FIT_MARGIN / per_step))
        if fit < self.total_steps * (1 - self.FIT_SLACK):
            what = "to finish in time"
        else:
            fit = min(fit, self.planned_steps())
            if fit <= self.total_steps * (1 + self.FIT_GROW):
                return None
            what = "longer, steps being faster now"
        self.end_at(fit)
        self.replan["by"] = "finish-within"
        self.log(f"schedule re-planned {what}: cosine from lr {self.replan['lr']:.2e} at step "
                 f"{self.step} to the floor at step {fit} ({per_step:.2f} s a step, {budget - used:.0f} s left)")
        return fit

    def _replay(self, replans: dict[int, int] | None) -> None:
        """fit()'s replans: end_at() where one is due at this step and not made yet."""
        if replans and replans.get(self.step, self.total_steps) != self.total_steps:
            self.end_at(replans[self.step])

    def request_stop(self, *_):
        self._stop = True

    def fit(self, stop_after: int | None = None, time_limit: float | None = None, progress: bool = True,
            finish_within: float | None = None, clock=time.perf_counter, replans: dict[int, int] | None = None
            ) -> dict:
        """Train to total_steps (or stop_after more steps / time_limit seconds), checkpointing on the way.
        finish_within: seconds by which the run must have annealed and finished (see fit_deadline). replans
        {step: end}: end_at(end) on reaching step (a finished run's re-plans replayed in one go: its card's
        command). Returns the last step's record."""
        cfg = self.cfg
        metrics = self.run_dir / "metrics.jsonl"
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _trim_metrics(metrics, self.step)
        start_step, t_start = self.step, clock()
        if finish_within is not None:
            time_limit = finish_within if time_limit is None else min(time_limit, finish_within)
        rec: dict = {}
        ema = None
        tty = progress and sys.stdout.isatty()
        recent, t_last = collections.deque(maxlen=self.FIT_WINDOW), t_start    # wall time between steps
        with open(metrics, "a") as mf:
            self._replay(replans)
            while self.step < self.total_steps and not self._stop:
                if stop_after is not None and self.step - start_step >= stop_after:
                    break
                if time_limit is not None and clock() - t_start >= time_limit:
                    break
                rec = self.train_step()
                self._replay(replans)
                if self.device.type == "cpu":
                    release_freed_memory()  # freed pages back: else the varying batch shapes grow glibc's heap
                t_now = clock()
                recent.append(t_now - t_last)
                t_last = t_now
                if finish_within is not None:
                    self.fit_deadline(start_step, t_now - t_start, finish_within, statistics.median(recent))
                rate = rec["tokens"] / max(rec["seconds"], 1e-9)
                ema = rate if ema is None else 0.9 * ema + 0.1 * rate
                rec["tok_s"] = round(rate, 1)
                last = self.step == self.total_steps
                if cfg.eval_every and (self.step % cfg.eval_every == 0 or last):
                    self.val_loss = self.evaluate(max_convs=None if last else cfg.val_convs)
                    self.val_full = last or len(self.val) <= cfg.val_convs
                    rec["val_loss"] = self.val_loss
                    rec["val_full"] = last
                mf.write(json.dumps({k: (round(v, 6) if isinstance(v, float) else v) for k, v in rec.items()}) + "\n")
                mf.flush()
                if progress and (self.step % cfg.log_every == 0 or "val_loss" in rec or last or self.step == 1):
                    line = self._line(rec, ema)
                    if tty:
                        print("\r" + line.ljust(120), end="" if "val_loss" not in rec else "\n", flush=True)
                    else:
                        print(line, flush=True)
                if cfg.ckpt_every and self.step % cfg.ckpt_every == 0 and not last:
                    self.save_checkpoint()
        if self.step > start_step:
            self.save_checkpoint()
        if tty:
            print()
        return rec

    def _line(self, rec: dict, ema: float | None) -> str:
        left = self.total_steps - self.step
        per_step = self.elapsed / max(self.step, 1)
        eta = _hms(left * per_step)
        val = f"{self.val_loss:.3f}" if self.val_loss is not None else "-"
        frac = self.step / self.total_steps
        bar = "#" * int(20 * frac) + "." * (20 - int(20 * frac))
        return (f"[{bar}] step {self.step}/{self.total_steps} | loss {rec['loss']:.3f} | val {val} | "
                f"lr {rec['lr']:.2e} | {ema or 0:,.0f} tok/s | {self.tokens_seen / 1e6:.2f}M tok | "
                f"{_hms(self.elapsed)} elapsed | ETA {eta}")


def _continued(log: list, step: int, now) -> list[list]:
    """A [from step, value] log (threads, device) as a resumed run continues it: a new stretch from `step` where
    the value changed."""
    log = [list(x) for x in log]
    return log if log[-1][1] == now else log + [[step, now]]


def device_name(device: torch.device) -> str:
    """'cpu', or the accelerator as the card names it: 'cuda (NVIDIA H200)'."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def _trim_metrics(path: Path, step: int) -> None:
    """Drop metric lines past `step` (written after the checkpoint a resumed run starts from)."""
    if not path.is_file():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= step]
    atomic_write_bytes(path, ("\n".join(keep) + ("\n" if keep else "")).encode())


def _hms(s: float) -> str:
    s = int(max(0, s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def load_data(shards, tok: Tokenizer, val_fraction: float, system: str = DEFAULT_SYSTEM, cache=None,
              weights: dict | None = None, splice: float = 0.0, seed: int = 0):
    return load_tokenized(shards, tok, val_fraction, system, cache, weights, splice, seed)
