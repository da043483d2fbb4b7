"""The learning-rate schedule of a training run: warmup, cosine, and the re-plans (`--end-at`, `--finish-within`,
`--replan`) that end it sooner or later. Torch-free, so the model card reads a run's re-plans without the trainer."""
from __future__ import annotations

import math


def lr_at(step: int, cfg, total_steps: int, replan: dict | None = None) -> float:
    """Linear warmup over cfg.warmup steps, then cosine from lr down to lr * min_lr_ratio at total_steps.
    replan {"from", "lr", "end", "planned", "prev"} (Trainer.end_at): from step `from` on, a cosine from `lr` (the
    schedule's value there, so nothing jumps) down to the same floor at step `end`; before it, the schedule as it
    was (`planned` steps, and any earlier re-plan `prev`)."""
    lo = cfg.lr * cfg.min_lr_ratio
    if replan:
        if step < replan["from"]:
            return lr_at(step, cfg, replan["planned"], replan.get("prev"))
        t = min(1.0, (step - replan["from"]) / max(1, replan["end"] - replan["from"]))
        return lo + (replan["lr"] - lo) * 0.5 * (1 + math.cos(math.pi * t))
    if cfg.warmup and step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, total_steps - cfg.warmup)
    t = min(1.0, (step - cfg.warmup) / span)
    return lo + (cfg.lr - lo) * 0.5 * (1 + math.cos(math.pi * t))


def replan_history(replan: dict | None) -> list[dict]:
    """A run's re-plans (Trainer.end_at's chain through "prev"), oldest first."""
    out = []
    while replan:
        out.insert(0, replan)
        replan = replan.get("prev")
    return out
