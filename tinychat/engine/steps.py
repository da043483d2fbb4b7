"""The decode steps: one protocol, one table. A step appends one token (tok, at position L of row 0 of the Decoder's
cache) and returns the logits (1, V) after it: `variant.step(decoder, L, tok)`. STEPS names every variant and when a
Decoder runs it; the Decoder takes the first whose `runs` holds (choose), once, and again when `fast` or `graph`
changes.

The reference is "eager": _decode_one, the model's one layer body (model.Block.forward) over one token, bit-identical
to append_chunked. "static" runs the same body with the device loop's fused kernels (engine/static.py). The others
are the fast CPU steps of a quantize_cpu model, written out as fused variants of that body (CpuStep, cpu_step.py,
holds what they share): the lean PyTorch steps (bf16 activations into the quant Linears: cpu_step._decode_fast for
TinyAgentLM's config, lean_step._decode_lean for any config) and the native int8 steps (native.c's tc_step,
native_llama.h's tc_llama_step). tests/unit/test_steps.py runs every variant in STEPS against the reference."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .append import _decode_one
from .cpu_step import _decode_fast
from .lean_step import _decode_lean
from .native_llama_step import _decode_native_llama
from .native_step import _decode_native
from .static import _step_static


def _eager(dec, L: int, tok: int) -> torch.Tensor:
    dec._tok.fill_(tok)
    return _decode_one(dec.model, dec.cache, dec._tok, L)


def _static(dec, L: int, tok: int) -> torch.Tensor:
    """The device loop's own step (a replayed turn rounds exactly as the live one), uncaptured."""
    dec._tok.fill_(tok)
    if getattr(dec, "_one", None) is None:
        dec._one = torch.ones(1, dtype=torch.long, device=dec.dev)
    logits = _step_static(dec.model, dec.cache, dec._tok, dec._one, dec._static_aux())
    dec.cache.lens_cpu[0] += 1
    return logits


def _native(dec, L: int, tok: int) -> torch.Tensor:
    st = dec.cpu_step
    return _decode_native(dec.model, dec.cache, tok, L, st, st.nat, step_in_c=st.step_in_c)


def _native_llama(dec, L: int, tok: int) -> torch.Tensor:
    """tc_llama_step; a cache it cannot read (not fp32 / fp16, not contiguous): the lean step."""
    logits = _decode_native_llama(dec.model, dec.cache, tok, L, dec.cpu_step, dec.cpu_step.nat)
    return logits if logits is not None else _lean_llama(dec, L, tok)


def _lean(dec, L: int, tok: int) -> torch.Tensor:
    dec._tok.fill_(tok)
    return _decode_fast(dec.model, dec.cache, dec._tok, L, dec.cpu_step)


def _lean_llama(dec, L: int, tok: int) -> torch.Tensor:
    dec._tok.fill_(tok)
    return _decode_lean(dec.model, dec.cache, dec._tok, L, dec.cpu_step)


def _lean_on(dec) -> bool:
    """A quantize_cpu model on the CPU with the fast steps on (Decoder.fast), not a device loop."""
    return dec.cpu_step is not None and dec.fast and not dec.graph


@dataclass(frozen=True)
class StepVariant:
    name: str
    runs: Callable[..., bool]                        # runs(decoder): does a decoder in this state take it
    step: Callable[..., torch.Tensor]                # step(decoder, L, tok) -> logits (1, V)
    what: str


STEPS = (
    StepVariant("static", lambda d: d.graph, _static,
                "Block.forward with the device loop's fused kernels (engine/static.py): graph decoders"),
    StepVariant("native", lambda d: _lean_on(d) and d.cpu_step.nat is not None and d.cpu_step.tinyagent, _native,
                "TinyAgentLM int8 in native kernels (native_step.py; native.c's tc_step)"),
    StepVariant("native-llama", lambda d: _lean_on(d) and d.cpu_step.nat is not None, _native_llama,
                "the llama family int8 in native kernels (native_llama_step.py; native_llama.h's tc_llama_step)"),
    StepVariant("lean", lambda d: _lean_on(d) and d.cpu_step.tinyagent, _lean,
                "TinyAgentLM's config quantized, PyTorch ops with bf16 activations (cpu_step._decode_fast)"),
    StepVariant("lean-llama", _lean_on, _lean_llama,
                "any config quantized, PyTorch ops with bf16 activations (lean_step._decode_lean)"),
    StepVariant("eager", lambda d: True, _eager,
                "the reference: Block.forward over one token (append._decode_one), bit-identical to append_chunked"),
)


def choose(dec) -> StepVariant:
    """The first variant in STEPS that a decoder in this state runs (eager always does)."""
    return next(v for v in STEPS if v.runs(dec))
