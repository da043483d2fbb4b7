"""Decoder: batch-1 token generation on row 0 of a KVCache (a chat turn's loop).

CPU (and graph=False): an eager loop, one host-sampled token per step; each step runs the exact op sequence of
append_chunked for one token (_decode_one: bit-identical logits) and sample_top_p. A quantize_cpu model steps through
a fast CPU step (its state: the cpu_step.CpuStep the Decoder builds; Decoder.fast = False: _decode_one). Which step
runs is engine/steps.py's table (Decoder.variant).
options: EngineOptions (native kernels, thread tuning; default EngineOptions.from_env()). plan: the ExecutionPlan
loading decided (plan.py): its options, quant mode and native step (None: asked of the model and options).
CUDA/XPU (graph=True, the default there; graph="static" runs the same step uncaptured, also on a CPU): one device
graph per step = append the current token, sample the next one on the device (inverse-CDF draw from a pre-drawn
uniform), store it; the host only reads the tokens back every sync_every steps. After <|im_end|> the steps are no-ops
on the cache, so the cache ends exactly as the eager loop leaves it. compile=True: torch.compile the step before
capture. When capture fails, the decoder falls back to the eager loop and says why (Decoder.fallback).
Keep one Decoder per KVCache: the graph is tied to that cache's tensors (reset() the cache instead of a new one)."""
from __future__ import annotations

import warnings

import torch

from .cache import KVCache
from .cpu_step import CpuStep
from .quant import bulk_prefill_kernel
from ..options import EngineOptions
from .sampling import _phrase_ban_mask, _sample_icdf, sample_top_p
from .static import _graph_api, _StaticAux, _StaticFeed, _step_static
from .steps import StepVariant, choose


def _ids(mask: torch.Tensor) -> list[int]:
    return mask.nonzero().flatten().tolist()


class Decoder:
    BAN_CAP = 1024  # phrase-ban entries the captured graph holds (grown, with a re-capture, when a turn needs more)
    BAN_K = 2       # context length of the phrase ban (n-gram order 3 - 1)
    ban_graph = True   # False after a capture with the ban ops failed: graphs without them, ban hooks run eagerly
    _fast = True       # CPU speed modes (quantize_cpu): step() runs a fast CPU step; False: _decode_one (see fast)
    _variant = None
    on_sync = None     # device loop: on_sync(tokens so far) after each read-back (streaming); False ends the turn
    keep_logits = False   # device loop: keep each draw's logits in last_logits (n, V), for sampler traces
    last_logits = None

    def __init__(self, model, cache: KVCache, graph=None, compile: bool = False, sync_every: int = 8,
                 feed: bool = True, options: EngineOptions | None = None, plan=None):
        if cache.B != 1:
            raise ValueError("Decoder is batch 1: make the KVCache with B=1")
        self.model, self.cache = model, cache
        self.options = plan.options if plan is not None else options or EngineOptions.from_env()
        self.dev = cache.gk.device
        api = _graph_api(self.dev)
        if graph == "static":           # the device-loop path without capture (tests on CPU; capture-free fallback)
            self.graph, self.capture = True, False
        else:
            self.graph = (api is not None) if graph is None else (bool(graph) and api is not None)
            self.capture = self.graph
        self.compile, self.sync_every = compile, max(1, int(sync_every))
        self._g = None
        self._key = None
        self.fallback = None
        self._aux = None
        self._tok = torch.zeros(1, 1, dtype=torch.long, device=self.dev)
        if self.graph and feed:          # append() of short chunks on this cache: captured graphs too
            cache.static_feed = _StaticFeed(model, cache, self._static_aux(), capture=self.capture)
        # the lean CPU step of a quantized model (None: fp32, or a device loop)
        mode, native, drop = (plan.quant, plan.native, plan.drop_pages) if plan is not None else (None, None, None)
        self.cpu_step = CpuStep.build(model, self.options, mode, native, drop) \
            if self.dev.type == "cpu" and not self.graph else None

    @property
    def fast(self) -> bool:
        """CPU speed modes (quantize_cpu): step() runs a fast CPU step (lean or native); False: _decode_one."""
        return self._fast

    @fast.setter
    def fast(self, on: bool) -> None:
        self._fast = bool(on)

    def _tuner(self):
        """The thread tuner of this decoder's fast CPU step (engine/threads.py), or None."""
        cs = self.cpu_step
        if cs is None or not self._fast:
            return None
        return cs.nat.tuner if cs.nat is not None else cs.lean_tuner

    def prefill_threads(self, rows: int) -> int | None:
        """The thread count a prefill of `rows` tokens on this decoder's cache should run at, or None (torch's, as it
        is): the decode step's tuner's choice (engine/threads.py) where the prefill runs the native GEMM, whose bits
        do not depend on the thread count (so replays stay exact); other GEMMs at the count the tuner tunes below,
        undoing what its steps left torch at (ThreadTuner.sync_torch)."""
        tuner = self._tuner()
        if tuner is None or not tuner.auto:
            return None
        ceiling = tuner.ceiling()
        if bulk_prefill_kernel(self.model, rows) != "native-gemm":
            return ceiling if torch.get_num_threads() != ceiling else None
        return tuner.choice if tuner.choice is not None and tuner.choice < ceiling else None

    @torch.no_grad()
    def settle_threads(self, budget_s: float = 1.0) -> int:
        """Run decode steps on this cache, then put it back (truncate to its mark: the K/V past the length is masked
        and rewritten in order, so nothing a turn sees changes), until the thread tuner's first trial is done or
        budget_s has passed: a chat on a machine whose other processes hold a core then starts its first reply, and
        the prefill before it, at the thread count that does not stall. A no-op without a tuning CPU step, with one
        thread, or once the tuner has tried. Returns the steps run."""
        tuner = self._tuner()
        room = self.cache.max_len - self.cache.length(0) - 1
        if tuner is None or not tuner.auto or tuner.trials or tuner.ceiling() <= 1 or room < 2:
            return 0
        import time
        mark = self.cache.mark()
        t0, n = time.perf_counter(), 0
        try:
            while not tuner.trials and n < room and time.perf_counter() - t0 < budget_s:
                self.step(0)
                n += 1
        finally:
            self.cache.truncate(mark)
        return n

    def step_changed(self) -> None:
        """The CPU step's native view was switched on or off (quant_steps.py): choose the variant again."""
        self._variant = None

    @property
    def variant(self) -> StepVariant:
        """The decode step step() runs (engine/steps.py's STEPS), chosen once per (graph, fast)."""
        v = self._variant
        if v is None or v[0] != (self.graph, self._fast):
            v = self._variant = ((self.graph, self._fast), choose(self))
        return v[1]

    @property
    def mode(self) -> str:
        """What generate() runs: "graph" (captured), "static" (uncaptured device loop), "fast-int8" / "fast-bf16"
        (the lean CPU step of a quantized model) or "eager"."""
        if not self.graph:
            return f"fast-{self.cpu_step.mode}" if self.cpu_step is not None and self.fast else "eager"
        return ("graph" if self.capture else "static") + ("+compile" if self.compile else "")

    def _static_aux(self):
        if self._aux is None:
            self._aux = _StaticAux(self.model, self.cache)
        return self._aux

    @torch.no_grad()
    def warmup(self, max_new: int, stop: int, temperature: float = 0.8, top_p: float = 0.95, pen: float = 1.0):
        """Capture the decode graph and every feed bucket now, so the first turns don't pay for it. Safe on any
        cache state: warm-up and capture are no-ops on the cache."""
        if not self.graph:
            return
        sf = self.cache.static_feed
        if sf is not None:
            for C in sf.BUCKETS:
                if C not in sf.g:
                    sf._graph(C)
        if self._g is None or self._key[:3] != (max_new, (temperature, top_p, pen), stop):
            try:
                self._setup(max_new, temperature, top_p, pen, stop)
            except Exception as e:  # noqa: BLE001  the phrase-ban ops: retry with the plain step (as generate does)
                if not self.ban_graph:
                    raise
                warnings.warn(f"Decoder: device graph setup with the phrase ban failed ({type(e).__name__}: {e}); "
                              "phrase-ban turns decode eagerly")
                self.ban_graph, self._g = False, None
                self._setup(max_new, temperature, top_p, pen, stop)

    @torch.no_grad()
    def step(self, tok: int) -> torch.Tensor:
        """Append one token (host int); returns the logits (1, V) after it, by the decode step variant chosen for
        this decoder (engine/steps.py): _decode_one, a fast CPU step of a quantize_cpu model, or the device loop's
        static step."""
        L = self.cache.length(0)
        if L + 1 > self.cache.max_len:
            raise RuntimeError(f"KV cache full: all {self.cache.max_len} positions are used")
        return self.variant.step(self, L, int(tok))

    def _masks(self, V, pen_ids, ban_ids):
        pm = torch.zeros(V, dtype=torch.bool)
        bm = torch.zeros(V, dtype=torch.bool)
        if pen_ids:
            pm[torch.as_tensor(list(pen_ids), dtype=torch.long)] = True
        if ban_ids:
            bm[torch.as_tensor(list(ban_ids), dtype=torch.long)] = True
        return pm.to(self.dev), bm.to(self.dev)

    @torch.no_grad()
    def generate(self, logits: torch.Tensor, max_new: int, stop: int, temperature: float = 0.8, top_p: float = 0.95,
                 pen: float = 1.0, pen_ids=(), ban_ids=(), generator=None, logits_hook=None) -> list[int]:
        """Sample up to max_new tokens starting from logits (1, V) (the prefill's), appending each one to the cache;
        stop (<|im_end|>) ends the turn and is appended too. A turn cut off at max_new gets stop appended so the cache
        stays well-formed. Returns the sampled tokens (stop included when sampled).
        logits_hook(out, logits) -> logits: called before every draw with the tokens sampled so far (a phrase ban).
        It runs on the host: the eager loop calls it. A hook with a `table` ({context tuple of k ids: [banned next
        ids]}) and `k` also works in the device-graph path, as fixed-size device tensors matched on the device
        (_phrase_ban_mask), so it keeps the graphs; any other hook means the eager loop."""
        V = logits.size(-1)
        pm, bm = self._masks(V, pen_ids if pen != 1.0 else (), ban_ids)
        L = int(self.cache.lens_cpu[0])
        table = getattr(logits_hook, "table", None)
        graph_ok = logits_hook is None or (self.ban_graph and isinstance(table, dict)
                                           and isinstance(getattr(logits_hook, "k", None), int))
        if self.graph and graph_ok and L + max_new + 1 <= self.cache.max_len and max_new > 0:
            return self._generate_graph(logits, max_new, stop, temperature, top_p, pen, pm, bm, generator, logits_hook)
        pm_ = pm if pen_ids and pen != 1.0 else None
        bm_ = bm if ban_ids else None
        ix = pm_.nonzero().squeeze(-1) if pm_ is not None and pm_.device.type == "cpu" else None   # once a turn
        out = []
        for _ in range(max_new):
            if logits_hook is not None:
                logits = logits_hook(out, logits)
            t = int(sample_top_p(logits, temperature, top_p, pen, pm_, bm_, generator, ix))
            out.append(t)
            logits = self.step(t)
            if t == stop:
                break
        if not out or out[-1] != stop:
            self.step(stop)
        return out

    # --- device graph path --------------------------------------------------------------------------------------
    def _setup(self, max_new, temperature, top_p, pen, stop, ban_cap=None, ban_k=None, ban_reply=False):
        """Allocate the step's buffers and build (capture, unless static) its body. ban_cap 0: no phrase-ban ops;
        ban_reply: the ban also covers the reply's own n-grams (matched in the sampled-token buffer)."""
        dev, cache = self.dev, self.cache
        n = max_new + 2
        V = self.model.cfg.vocab_size
        ban_cap = (self.BAN_CAP if self.ban_graph else 0) if ban_cap is None else ban_cap
        ban_k = ban_k or self.BAN_K
        self._done = torch.ones(1, dtype=torch.bool, device=dev)
        self._i = torch.zeros(1, dtype=torch.long, device=dev)
        self._out = torch.zeros(n, dtype=torch.long, device=dev)
        self._u = torch.zeros(n, device=dev)
        self._pm = torch.zeros(1, V, dtype=torch.bool, device=dev)
        self._bm = torch.zeros_like(self._pm)
        # the phrase ban (a logits_hook with a table): rows of k context ids (-1: unused) -> banned id (V: unused)
        self._ban_ctx = torch.full((ban_cap, ban_k), -1, dtype=torch.long, device=dev)
        self._ban_tok = torch.full((ban_cap,), V, dtype=torch.long, device=dev)
        self._ban_scratch = torch.zeros(V + 1, device=dev)
        self._ban_ar = torch.arange(ban_k, device=dev)
        self._ban_pos = torch.arange(n, device=dev) if ban_cap and ban_reply else None
        keep = self.keep_logits
        self._logits = torch.zeros(n, V, device=dev) if keep else None     # (max_new + 2, V): row i = draw i
        aux = self._static_aux()     # the graph reads these: kept alive on the decoder
        self._stop = stop
        samp = (temperature, top_p, pen)

        def body():
            live = ~self._done
            lg = _step_static(self.model, cache, self._tok, live.long(), aux)
            if keep:
                self._logits.index_copy_(0, self._i, lg.float())
            self._done |= self._tok[0] == stop
            u = self._u.index_select(0, self._i)
            bm = self._bm
            if ban_cap:
                bm = bm | _phrase_ban_mask(self._out, self._i, self._ban_ctx, self._ban_tok, self._ban_scratch,
                                           self._ban_ar, self._ban_pos)
            nxt = _sample_icdf(lg, *samp, self._pm, bm, u)
            self._out.index_copy_(0, self._i, nxt)
            self._i += 1
            self._tok.copy_(nxt.view(1, 1))

        fn = self._fn = torch.compile(body, fullgraph=False, dynamic=False) if self.compile else body
        self._key = (max_new, samp, stop, ban_cap, ban_k, keep, bool(ban_cap and ban_reply))
        if not self.capture:
            self._g = fn
            return
        Graph, graph_ctx, Stream, stream_ctx, current = _graph_api(dev)
        s = Stream()
        s.wait_stream(current())
        with stream_ctx(s):          # warm-up with done=True: every write lands in a scratch slot
            for _ in range(3):
                fn()
                self._i.zero_()
        current().wait_stream(s)
        g = Graph()
        with graph_ctx(g):
            fn()
        self._i.zero_()
        self._g = g.replay

    def clear_turn_state(self):
        """Forget what the last turn left in the device-graph buffers: the phrase-ban table, the penalty / ban masks
        and the sampled tokens. In place, so the captured graphs stay valid and nothing is rebuilt; every turn
        refills these anyway, so decoding is unchanged. Eager-only decoders (CPU) hold none of it."""
        if self._key is None or getattr(self, "_ban_ctx", None) is None:
            return
        with torch.no_grad():
            self._ban_ctx.fill_(-1)
            self._ban_tok.fill_(self.model.cfg.vocab_size)
            self._pm.zero_()
            self._bm.zero_()
            self._out.zero_()

    def _generate_graph(self, logits, max_new, stop, temperature, top_p, pen, pm, bm, generator, hook=None):
        table = getattr(hook, "table", None) or {}
        rows = [(ctx, t) for ctx, toks in table.items() for t in toks]
        reply = bool(getattr(hook, "reply", False))
        k = hook.k if table or reply else (self._key[4] if self._key else self.BAN_K)
        keep = bool(self.keep_logits)
        if not self.ban_graph:
            cap = 0
        else:
            cap = (self._key[3] if self._key else 0) or self.BAN_CAP
            while cap < len(rows):
                cap *= 2
        if self._g is None or self._key != (max_new, (temperature, top_p, pen), stop, cap, k, keep, reply and cap > 0):
            try:
                self._setup(max_new, temperature, top_p, pen, stop, cap, k, reply)
            except Exception as e:  # noqa: BLE001  e.g. an op this backend can't capture
                if cap:   # first without the phrase-ban ops: plain turns keep their graphs, ban hooks run eagerly
                    warnings.warn(f"Decoder: device graph setup with the phrase ban failed ({type(e).__name__}: {e}); "
                                  "phrase-ban turns decode eagerly")
                    self.ban_graph, self._g = False, None
                else:
                    warnings.warn(f"Decoder: device graph setup failed ({type(e).__name__}: {e}); decoding eagerly")
                    self.graph, self.fallback = False, f"{type(e).__name__}: {e}"[:300]
                    self._g = None
                    self._done = None
                return self.generate(logits, max_new, stop, temperature, top_p, pen,
                                     _ids(pm) if pen != 1.0 else (), _ids(bm), generator, hook)
        if cap:
            self._ban_ctx.fill_(-1)      # this turn's phrase ban, outside the graph (the graph reads these tensors)
            self._ban_tok.fill_(self.model.cfg.vocab_size)
        if cap and rows:
            self._ban_ctx[:len(rows)].copy_(torch.tensor([c for c, _ in rows], dtype=torch.long))
            self._ban_tok[:len(rows)].copy_(torch.tensor([t for _, t in rows], dtype=torch.long))
        self._pm.copy_(pm.view(1, -1))
        self._bm.copy_(bm.view(1, -1))
        self._u.copy_(torch.rand(self._u.shape, device=self.dev, generator=generator))
        self._i.zero_()
        first = _sample_icdf(logits, temperature, top_p, pen, self._pm, self._bm, self._u[:1])
        if keep:
            self._logits[0].copy_(logits[0].float())
        self._out[:1].copy_(first)
        self._tok.copy_(first.view(1, 1))
        self._i.fill_(1)
        self._done.zero_()
        n = 0
        toks = None
        while n < max_new:
            k_ = min(self.sync_every, max_new - n)
            for _ in range(k_):
                self._g()
            n += k_
            toks = self._out[:n].tolist()
            if stop in toks:
                break
            if self.on_sync is not None and self.on_sync(toks) is False:
                break               # stopped by the caller: ends like a cut-off turn
        if stop in toks:
            toks = toks[:toks.index(stop) + 1]
        else:                       # cut off: append stop (its sampled successor is ignored)
            self._tok.fill_(stop)
            self._g()
        self._done.fill_(True)
        self.cache.lens_cpu.copy_(self.cache.lens.cpu())
        self.last_logits = self._logits[:len(toks)].cpu() if keep else None
        return toks
