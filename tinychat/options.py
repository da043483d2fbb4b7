"""EngineOptions: how the engine runs a model, as one object handed to Decoder, quantize_cpu, append and Chat (never
module globals flipped from outside). Torch-free. Environment variables set the defaults (EngineOptions.from_env:
TINYCHAT_NATIVE, TINYCHAT_STEP_IN_C, TINYCHAT_PREFILL_BF16, TINYCHAT_PAD_SHAPES, TINYCHAT_TUNE_THREADS,
TINYCHAT_DROP_PAGES, TINYCHAT_HEAD4, each 0 or 1; the tri-state ones "auto" too; TINYCHAT_KV_CACHE: auto, fp16 or fp32);
engine/native.py reads TINYCHAT_NATIVE=0 too, and then does not build the kernels at all."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class EngineOptions:
    native: bool = True                 # int8 models: the lean CPU step in the native kernels where they build
    step_in_c: bool = True              # the native step as one tc_step call (False: the kernels driven from Python)
    prefill_bf16: bool | None = None    # quant Linears prefill through bf16 GEMMs; None: int8 / int4 models on the
                                        # native GEMMs where the kernels run (but AMX machines), else (and bf16 models)
                                        # bf16 GEMMs where the CPU has bf16 dot products (AVX512-BF16 / AMX), else
                                        # fp32 GEMMs
    pad_shapes: bool | None = None      # append pads chunks to stable shapes; None: on GPUs only (True: tests)
    tune_threads: bool = True           # the native step picks its thread count by measurement (threads.py);
                                        # False: torch.get_num_threads() as set (the CLI's --threads N)
    drop_pages: bool | None = None      # a stored-quantized model's mapped weight pages handed back once read (the
                                        # native step per layer, a quant Linear after its prefill: engine/page_drop.py);
                                        # None: on for stored models of page_drop.DROP_MIN_BYTES (4 GiB) or more of
                                        # mapped quant weights (less resident memory, slower decode), else only a
                                        # two-level head's int8 rows after each step (read a few a token: ~free)
    kv_cache: str = "auto"              # the CPU KV cache of an int8 / int4 global-attention (llama-family) model:
                                        # "fp16" (half the memory and the bytes a step reads; sessions record
                                        # "+kv16" with the step), "fp32", or "auto": fp16 where the native step runs
                                        # (plan.kv_format); TinyAgentLM's ring cache and GPUs' bf16 stay as they are
    head4: bool = True                  # int4 and stored-int8 llama-family models: the two-level head (two_level_head.py:
                                        # every logit from an int4 copy of the head, the best RESCORE_K recomputed
                                        # from its int8 rows; sessions record "+h4"); False: the int8 head alone
    huge_pages: bool = True             # int8 / int4 CPU models: the weights a decode step streams copied into one
                                        # anonymous mapping on transparent huge pages (engine/weight_arena.py) where
                                        # the kernel has them, unless pages drop per layer; False: left where loaded

    ENV = {"native": "TINYCHAT_NATIVE", "step_in_c": "TINYCHAT_STEP_IN_C",
           "prefill_bf16": "TINYCHAT_PREFILL_BF16", "pad_shapes": "TINYCHAT_PAD_SHAPES",
           "tune_threads": "TINYCHAT_TUNE_THREADS", "drop_pages": "TINYCHAT_DROP_PAGES",
           "kv_cache": "TINYCHAT_KV_CACHE", "head4": "TINYCHAT_HEAD4", "huge_pages": "TINYCHAT_HUGE_PAGES"}
    KV_CACHES = ("auto", "fp16", "fp32")

    def __post_init__(self):
        if self.kv_cache not in self.KV_CACHES:
            raise ValueError(f"kv_cache must be one of {', '.join(self.KV_CACHES)}, not {self.kv_cache!r}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kw) -> "EngineOptions":
        """The defaults, each overridden by its environment variable when set ("0"/"1"; "auto" = None for the
        tri-state ones), then by kw."""
        env = os.environ if env is None else env
        vals: dict = {}
        for name, var in cls.ENV.items():
            raw = env.get(var, "").strip().lower()
            if name == "kv_cache":
                if raw:
                    vals[name] = raw
            elif raw in ("1", "true", "yes", "on"):
                vals[name] = True
            elif raw in ("0", "false", "no", "off"):
                vals[name] = False
        return cls(**{**vals, **kw})

    def replace(self, **kw) -> "EngineOptions":
        return dataclasses.replace(self, **kw)
