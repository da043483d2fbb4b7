"""The two-level head of `--quant int8` and `--quant int4` llama-family models (issue #34): the int8 head (an
Int8Linear, a tied model's embedding rows too: head_embed.py) carries an int4 copy of its weights, `q4weight` / `q4scale` (quantize_int4's
format, native_q4_layout.h: about half the int8 rows' bytes). A step scans all V logits with the copy (the int4
GEMV / GEMM, int8 activations), then recomputes the RESCORE_K best of them exactly from the int8 rows against the
fp32 hidden state (append.rescore_top; native_llama.h's rescore in the native step). Greedy and the sampler's nucleus
see the int8 head's exact logits for every candidate that matters; only the tail, far below the top, keeps int4
values. Decode then reads the copy (~0.56 bytes a weight) and about RESCORE_K + 1 int8 rows a token instead of the
whole int8 head: on a 1B model's 128256 x 2048 tied head, 148 MB instead of 263 MB a token.

Quality (SmolLM2-135M on tests/perf/data/held_text.txt, docs/benchmarks.md "Two-level int4 head"): greedy's token the
int8 head's at every scored position; perplexity 31.24 against the int8 head's 30.97 at k = 128 (the tail's int4
values: 31.34 at k = 64, 32.03 at 16; the int4 copy alone 36.83).

The copy is built by quantize_cpu (quant.py, from the full-precision head weights where the int8 rows are made) for
an int4 llama-family model unless EngineOptions.head4 is off, and for an int8 one where the stored file is made
(`import --quant int8`; quantizing an fp32 import at start skips it: its scale search would cost each start
seconds), and stored in stored-quantized files (quant_files.py: "head.q4weight" / "head.q4scale"; an older file
without them runs the int8 head as before). At int8
it costs SmolLM2-135M 26.00 -> 26.20 perplexity on the held text and gave the Qwen2.5-0.5B shape's decode 1.04x /
1.33x at 1 / 2 threads (docs/benchmarks.md, "The two-level head for int8"). Sessions record "+h4"
with the step (plan.step_name): another rounding of the tail's logits, so another step to replay on."""
from __future__ import annotations

import torch

from .int4_rules import Q4S, Q4W
from .quant_int4 import Int4Linear

RESCORE_K = 128         # the int4 scan's best candidates recomputed from the int8 rows (native_llama.h's TC_MAXK)


def active(head) -> bool:
    """Does the head scan with its int4 copy (a two-level head)?"""
    return getattr(head, Q4W, None) is not None


def attach(head, q4weight: torch.Tensor, q4scale: torch.Tensor) -> None:
    """Give the int8 head its int4 copy (packed (V, pad64(d) / 2) uint8, fp16 (V, pad64(d) / 32) scales), as buffers."""
    head.register_buffer(Q4W, q4weight)
    head.register_buffer(Q4S, q4scale)
    head.__dict__.pop("_q4", None)


def detach(head) -> None:
    """Drop the copy (EngineOptions.head4 off on a stored model that has one): the int8 head alone again."""
    for name in (Q4W, Q4S):
        if name in head._buffers:
            del head._buffers[name]
    head.__dict__.pop("_q4", None)


def view(head):
    """The copy as an Int4Linear (cached on the head; the head's tensors, no copy): its forward runs the native int4
    GEMM (the decode GEMV's rounding per row) where the kernels load, else the dequantized weights."""
    q = head.__dict__.get("_q4")
    if q is None or q.qweight is not getattr(head, Q4W):
        q = Int4Linear.from_packed(getattr(head, Q4W), getattr(head, Q4S), None, head.in_features,
                                   native=getattr(head, "native", True))
        head.__dict__["_q4"] = q
    q.native = getattr(head, "native", True)
    return q


def scan(head, h: torch.Tensor) -> torch.Tensor:
    """Every logit of the int4 copy at the fp32 hidden states h (rows, d) -> (rows, V) fp32 (not rescored)."""
    return view(head)(h.float()).float()


def naive_logits(head, h: torch.Tensor, k: int = RESCORE_K) -> torch.Tensor:
    """The reference two-level logits in float64: the copy's dequantized weights against h (fp32 activations: the
    kernels round them to int8, so their scan differs by that rounding), the k best of those recomputed from the int8
    rows. A test helper."""
    from .native import dequant4_ref
    d = head.in_features
    w4 = dequant4_ref(getattr(head, Q4W), getattr(head, Q4S), d)
    h2 = h.reshape(-1, d).double()
    lg = h2 @ w4.T
    ids = lg.topk(min(k, lg.size(-1)), dim=-1).indices
    rows = head.qweight.double()[ids] * head.scale.double()[ids][..., None]
    return lg.scatter(1, ids, torch.einsum("nkd,nd->nk", rows, h2))


def nbytes(head) -> int:
    """The bytes of the int4 copy (0: none)."""
    return sum(t.numel() * t.element_size() for t in (getattr(head, Q4W, None), getattr(head, Q4S, None))
               if t is not None)
