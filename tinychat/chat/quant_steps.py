"""The int8 (and int4) steps of a chat: which one runs here, by the name sessions record with each turn, and running a turn
on the step it recorded where this machine has it (issue #33 item 11).

A step's name (Chat.step_name) says what rounds a turn's numbers: the decode step ("native-int8-v<N>" or
"torch-int8", the PyTorch fallback without kernels; for `--quant int4` "native-int4-v<N>" or "torch-int4"), the prefill's GEMM where it is not the decode step's own
("+native-prefill-v<N>", "+bf16-prefill", "+fp32-prefill"), "+h4" for the two-level int4 head
(engine/two_level_head.py), "+kv16" for an fp16 KV cache, and the kernels' path ("@avx512-vnni", ...). A session's
turns can name different steps: a chat continued where the kernels did not build (a removed cache and a full disk)
ran its later turns on the PyTorch step. Each turn is replayed, and fed again when a chat rebuilds its cache (a
restore, a switch of branch, an edit), on the step it recorded where that step is available here: the PyTorch step
always is (with any prefill GEMM), the native one where the kernels load at that version and path. So a session with
mixed steps replays token-exact and its cache comes back as it was; a step not available here is reported, not
taken for a divergence (replay.py).

A configuration is the decode step (CpuStep.nat: the native kernels' view, or None for the PyTorch step) and the
Int8Linears' prefill settings (their `native` flag and `prefill_bf16`, which pick the native int8 GEMM, bf16 or fp32
GEMMs: Int8Linear.prefill_kernel), the model's fused q/k/v projections included."""
from __future__ import annotations

import contextlib
import itertools

from ..plan import step_name


class Int8Steps:
    """The steps a chat's int8 model can run here, by name; `use(name)` switches, `running(name)` for a while."""

    def __init__(self, model, decoder, plan):
        """plan: the chat's ExecutionPlan (plan.py): its mode and device say whether int8 steps run at all, its kernel
        path and step version name the native ones."""
        self.model, self.decoder, self.plan = model, decoder, plan
        self.active = plan.int8_cpu and decoder.cpu_step is not None
        self._nat = decoder.cpu_step.nat if self.active else None
        self._configs: dict[str, tuple] | None = None
        self.default = self._current() if self.active else None

    # -- names ---------------------------------------------------------------------------------------------------
    def name(self) -> str | None:
        """The step the chat runs now, as a session records it (None: not an int8 CPU chat): plan.step_name of the
        decode step in use and the prefill GEMM the Linears are set to."""
        if not self.active:
            return None
        from ..engine import two_level_head as head4
        from ..engine.quant import bulk_prefill_kernel
        p = self.plan
        return step_name(self.decoder.cpu_step.nat is not None, bulk_prefill_kernel(self.model), p.step_version,
                         p.kernel_path, p.quant, self.decoder.cache.kv16, head4.active(self.model.head))

    def available(self) -> dict[str, tuple]:
        """{step name: configuration} of every step this chat can run here (found by trying each configuration)."""
        if self._configs is None:
            self._configs = {}
            if self.active:
                was = self._current()
                nat = [True, False] if self._native() is not None else [False]
                for cfg in itertools.product(nat, (True, False), (None, True, False)):
                    self._apply(cfg)
                    self._configs.setdefault(self.name(), cfg)
                self._configs.setdefault(self.name(), was)
                self._apply(was)
        return self._configs

    # -- switching -----------------------------------------------------------------------------------------------
    def use(self, name: str | None) -> bool:
        """Run the step `name` from now on (None: the chat's own default). False, changing nothing, when this machine
        does not have it (or the chat is not an int8 one)."""
        if not self.active:
            return name is None
        cfg = self.default if name is None else self.available().get(name)
        if cfg is None:
            return False
        self._apply(cfg)
        return True

    @contextlib.contextmanager
    def running(self, name: str | None):
        """The step `name` while the block runs, where it is available here (else the current one), then back."""
        if not self.active or name is None:
            yield
            return
        was = self._current()
        self.use(name)
        try:
            yield
        finally:
            self._apply(was)

    # -- configurations ------------------------------------------------------------------------------------------
    def _linears(self) -> list:
        from ..engine.quant import Int4Linear, Int8Linear
        kinds = (Int8Linear, Int4Linear)
        out = [m for m in self.model.modules() if type(m) in kinds]
        return out + [m for m in getattr(self.model, "fused_qkv", None) or () if type(m) in kinds]

    def _current(self) -> tuple:
        lin = next(iter(self._linears()), None)
        return (self.decoder.cpu_step.nat is not None, bool(getattr(lin, "native", True)),
                getattr(lin, "prefill_bf16", None))

    def _native(self):
        """The native kernels' view of the model, built when first needed (a chat opened with them off)."""
        if self._nat is None:
            if self.plan.kernel_path is not None:       # the kernels load here (decided with the plan)
                step = self.decoder.cpu_step
                from ..engine.native_llama_step import _NativeLlama
                from ..engine.native_step import _NativeStep
                from ..engine.threads import ThreadTuner
                self._nat = (_NativeStep if step.tinyagent else _NativeLlama).build(self.model, step)
                if self._nat is not None:
                    self._nat.tuner = ThreadTuner(auto=self.plan.options.tune_threads)
        return self._nat

    def _apply(self, cfg: tuple) -> None:
        nat, lin_native, prefill_bf16 = cfg
        self.decoder.cpu_step.nat = self._native() if nat else None
        self.decoder.step_changed()
        for lin in self._linears():
            lin.native, lin.prefill_bf16 = lin_native, prefill_bf16


PREFILLS = {"bf16-prefill": "bf16 prefill GEMMs", "fp32-prefill": "fp32 prefill GEMMs"}


def describe_step(step: str | None) -> str:
    """'native-int8-v1' -> 'the native int8 step v1'; 'torch-int8' -> 'the PyTorch int8 step (...)';
    'torch-int8+native-prefill-v3' -> 'the PyTorch int8 step after the native int8 prefill v3';
    'native-int8-v3+bf16-prefill' -> 'the native int8 step v3 with bf16 prefill GEMMs'; '...@avx2-vnni' adds
    ' on avx2-vnni kernels' (Chat.step_name)."""
    if not step:
        return "an unknown int8 step"
    step, _, path = step.partition("@")
    if path:
        return f"{describe_step(step)} on {path} kernels"
    if step.endswith("+kv16"):
        return f"{describe_step(step[:-5])} with an fp16 KV cache"
    if step.endswith("+h4"):
        return f"{describe_step(step[:-3])} with the two-level int4 head"
    decode, _, prefill = step.partition("+")
    mode = "int4" if decode.endswith("-int4") or decode.startswith("native-int4-v") else "int8"
    if decode.startswith(f"native-{mode}-v"):
        text = f"the native {mode} step v{decode.rsplit('v', 1)[1]}"
    elif decode == f"torch-{mode}":
        text = f"the PyTorch {mode} step" if prefill else f"the PyTorch {mode} step (the fallback: no native kernels)"
    else:
        return f"the int8 step {step!r}"
    if prefill.startswith("native-prefill-v"):
        return f"{text} after the native {mode} prefill v{prefill.rsplit('v', 1)[1]}"
    if prefill in PREFILLS:
        return f"{text} with {PREFILLS[prefill]}"
    return text if not prefill else f"the {mode} step {step!r}"
