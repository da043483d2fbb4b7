"""ExecutionPlan: how a loaded model runs, decided once (decide(), called by loading.open_chat / open_replay_chat
and bench) and handed down to the Chat, its Decoder and its int8 steps (chat/quant_steps.py), which read it and never
derive it again from the model's Linear classes or the kernels.

What it holds: the weights' quant mode (the model was quantized to it in loading), the device, the engine options,
whether the native int8 kernels run here and their path and step version (what sessions record with each int8
turn: "native-int8-v<N>@<path>"), the prefill GEMM the int8 Linears were set up with, the torch thread count and
why `--quant auto` chose the mode. Torch-free to import: decide() imports torch and the engine when it runs."""
from __future__ import annotations

from dataclasses import dataclass, field

from .options import EngineOptions


@dataclass(frozen=True)
class ExecutionPlan:
    quant: str = "none"                 # the weights' mode: none, int8, int4, bf16 (effective: int8 without the
                                        # torch int8 kernel is bf16)
    device: str = "cpu"                 # a torch device: cpu, cuda, cuda:1
    options: EngineOptions = field(default_factory=EngineOptions)
    graph: bool | str | None = None     # the Decoder's device loop (None: on GPUs; "static": uncaptured, tests)
    kernel_path: str | None = None      # the native int8 kernels' path here (avx512-vnni, avx2-vnni, neon-dotprod,
                                        # ...); None: they do not load, or the plan is not an int8 CPU one
    step_version: int | None = None     # the native int8 step version on that path (native.KERNEL_PATHS); int4's:
                                        # native.INT4_STEP_VERSION
    prefill_gemm: str | None = None     # an int8 model's long prefill: native-gemm, bf16-gemm or fp32-gemm (None:
                                        # not int8)
    threads: int = 0                    # torch's thread count when decided (0: not known)
    quant_why: str | None = None        # why `--quant auto` chose the mode (None: a mode given by hand)
    drop_pages: bool = False            # the model's mapped weight pages go back once read (options.drop_pages
                                        # resolved: engine/page_drop.py; a stored-quantized model only)
    kv_cache: str | None = None         # the CPU KV cache's format, "fp16" or "fp32" (kv_format: EngineOptions.kv_cache
                                        # resolved); None: not decided (fp32 on the CPU, bf16 on GPUs)
    head4: bool = False                 # the two-level int4 head runs (engine/two_level_head.py: an int8 / int4
                                        # llama-family model whose head carries its int4 copy; sessions record "+h4")
    huge_pages: int = 0                 # bytes of streamed weights on the huge-page arena (engine/weight_arena.py;
                                        # 0: left where they were loaded)

    def kv_dtype(self):
        """The torch dtype of the chat's KV cache: kv_cache's, else fp32 on the CPU and bf16 on GPUs."""
        import torch
        if self.kv_cache is not None:
            return torch.float16 if self.kv_cache == "fp16" else torch.float32
        return torch.float32 if self.device.split(":")[0] == "cpu" else torch.bfloat16

    @property
    def int8_cpu(self) -> bool:
        """The int8 (or int4) steps run (and sessions record which one made each turn: quant_steps.py)."""
        return self.quant in ("int8", "int4") and self.device.split(":")[0] == "cpu"

    @property
    def native(self) -> bool:
        """The decode step runs in the native kernels where the model's shapes let it (they load, options.native)."""
        return self.int8_cpu and self.kernel_path is not None and self.options.native

    @property
    def step(self) -> str | None:
        """The int8 step a chat on this plan runs by default, as sessions record it (None: not an int8 CPU plan);
        a model the native step cannot express runs the PyTorch one (Int8Steps.name says what runs)."""
        if not self.int8_cpu:
            return None
        return step_name(self.native, self.prefill_gemm, self.step_version, self.kernel_path, self.quant,
                         self.kv_cache == "fp16", self.head4)


def step_name(native: bool, prefill: str | None, version: int | None, path: str | None, mode: str = "int8",
              kv16: bool = False, h4: bool = False) -> str:
    """The int8 step's name as sessions record it: the decode step ("native-int8-v<N>", or "torch-int8", the
    fallback without kernels), then the prefill's GEMM where it is not the decode step's own rounding
    ("+native-prefill-v<N>", "+bf16-prefill", "+fp32-prefill"), then, where native kernels run, "@" and their path.
    native: the decode step runs in the kernels; prefill: the int8 Linears' prefill kernel (Int8Linear.prefill_kernel);
    version, path: the plan's; mode: int8 or int4 ("native-int4-v<N>", "torch-int4"); kv16: the KV cache holds fp16
    ("+kv16" before the path: another rounding of every attention, so another step to replay on); h4: the two-level
    int4 head (engine/two_level_head.py: "+h4" before "+kv16", another rounding of the logits' tail)."""
    name = f"native-{mode}-v{version}" if native else f"torch-{mode}"
    if prefill == "native-gemm" and not native:
        name += f"+native-prefill-v{version}"
    elif prefill == "bf16-gemm":
        name += "+bf16-prefill"
    elif prefill == "fp32-gemm" and native:
        name += "+fp32-prefill"
    if h4:
        name += "+h4"
    if kv16:
        name += "+kv16"
    if native or prefill == "native-gemm":
        name += f"@{path}"           # vector widths sum in other orders: avx512-vnni, avx2-vnni, ...
    return name


def decide(model, quant: str | None = None, device: str = "cpu", options: EngineOptions | None = None, *,
           graph=None, quant_why: str | None = None) -> ExecutionPlan:
    """Quantize `model` in place to `quant` and decide how it runs: the ExecutionPlan a Chat and its Decoder are
    handed (loading.open_chat decides it; Chat(model, ..., quant=...) without a plan too, for callers that hand it a
    bare model). quant: none, int8 or bf16 (None: the model's mode as it is). An fp32 model is quantized
    (quantize_cpu); a model already quantized to another mode is a ChatError, never a silent switch (a model shared
    by chats runs one mode). options: EngineOptions (None: EngineOptions.from_env()). The one place that asks the
    model's Linear classes, the native kernels and the prefill GEMM what runs here."""
    import torch

    from .engine import native, quantize_cpu
    from .engine import two_level_head as head4
    from .engine.quant import bulk_prefill_kernel, effective_mode, quant_mode
    from .settings import ChatError
    options = options or EngineOptions.from_env()
    have = quant_mode(model)
    want = have if quant is None else effective_mode(quant)
    stored = getattr(model, "stored_quant", None)     # a stored-quantized file (quant_files.py): its mode only
    drop = False
    if stored is not None:
        from .quant_files import configure, mismatch
        if quant is not None and quant_why is None and quant != stored:
            raise ChatError(mismatch(stored, quant))
        if quant_why is not None and want != stored:
            quant_why = f"the model is stored {stored}"
        want = stored                       # --quant auto takes the stored mode
        drop = configure(model, options)    # its Linears' options, and whether its mapped pages go back once read
        from .engine.quant import release_freed_memory
        release_freed_memory()              # what loading freed (the tokenizer's), as quantizing at start does
    if want == "none":
        model.linears_to(torch.float32)   # a model loaded to be quantized (stored_linears) runs in fp32 here
    if want != have:
        if have != "none":
            raise ChatError(f"the model is already loaded as --quant {have}; --quant {want} needs it loaded again")
        quantize_cpu(model, want, options=options)
    dev = torch.device(device).type
    path = version = prefill = None
    if want in ("int8", "int4") and dev == "cpu":
        if native.load() is not None:    # built on first use (cached); the step a session records names its path
            path = native.kernel_path()
            version = native.INT4_STEP_VERSION if want == "int4" else native.step_version(path)
        prefill = bulk_prefill_kernel(model)
    h4 = want in ("int8", "int4") and dev == "cpu" and head4.active(getattr(model, "head", None))
    arena = 0
    if want in ("int8", "int4") and dev == "cpu" and options.huge_pages and not drop:
        from .engine import weight_arena
        if weight_arena.available():
            arena = weight_arena.place(model, head4=h4)
    return ExecutionPlan(quant=want, device=str(torch.device(device)), options=options, graph=graph, kernel_path=path,
                         step_version=version, prefill_gemm=prefill, threads=torch.get_num_threads(),
                         quant_why=quant_why, drop_pages=drop, kv_cache=kv_format(model, want, dev, options, path),
                         head4=h4, huge_pages=arena)


def kv_format(model, mode: str, dev: str, options: EngineOptions, path: str | None) -> str | None:
    """The KV cache's format on the CPU, "fp16" or "fp32" (None on GPUs: bf16). fp16 only for an int8 / int4 model
    whose layers are all global (the llama family; TinyAgentLM's local ring keeps fp32) and whose steps sessions
    record; options.kv_cache "auto" takes it where the native step runs on SIMD kernels (F16C / AVX-512 or NEON
    conversions: not the scalar path), where it halves the bytes a long context's step reads (docs/benchmarks.md,
    "fp16 KV cache")."""
    if dev != "cpu":
        return None
    cfg = model.cfg
    if mode not in ("int8", "int4") or cfg.has_local or cfg.is_tinyagent or options.kv_cache == "fp32":
        return "fp32"
    if options.kv_cache == "fp16":
        return "fp16"
    llama_step = (cfg.kv_group == 1 and cfg.mlp_kind == "swiglu" and not cfg.qk_norm  # the shapes tc_llama_step
                  and not model.engram_modules())                                     # runs (native_llama_step)
    return "fp16" if llama_step and options.native and path is not None and path != "scalar" else "fp32"
