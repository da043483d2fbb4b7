"""The small-KV-cache incremental decoder (the user's decode module, restructured).

Public names and signatures follow the user's module, so code written against it works by changing one import:
KVCache, append, append_chunked, Decoder, sample, sample_top_p, quantize_cpu, Int8Linear, BF16Linear.
The engine yields token ids and logits; it knows nothing of text or the UI."""
from ..choices import QUANT_MODES
from ..options import EngineOptions
from .append import CHUNK, append, append_chunked
from .cache import KVCache
from .decoder import Decoder
from .quant import BF16Linear, Int8Linear, int8_kernel_ok, quantize_cpu
from .sampling import TOPK_SAMPLE_MIN, apply_ban_and_penalty, sample, sample_top_p

__all__ = ["KVCache", "append", "append_chunked", "Decoder", "sample", "sample_top_p", "quantize_cpu", "Int8Linear",
           "BF16Linear", "CHUNK", "TOPK_SAMPLE_MIN", "QUANT_MODES", "int8_kernel_ok", "apply_ban_and_penalty",
           "EngineOptions"]
