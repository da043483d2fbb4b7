"""The contract with the user's own decode module: it runs unmodified on tinychat models (its `tiny_agent.model`
import aliased to tinychat.model) and agrees with tinychat.engine token for token.

The module is the user's, not part of this project: point TINYCHAT_SEED_MODULE at its file to run this check;
without it the test is skipped."""
import importlib.util
import os
import sys
import types
from importlib.machinery import SourceFileLoader

import pytest
import torch

import tinychat.engine as E
import tinychat.model
from support import make_model

SEED = os.environ.get("TINYCHAT_SEED_MODULE")
pytestmark = pytest.mark.skipif(not SEED, reason="set TINYCHAT_SEED_MODULE to the user's decode module to check it")


@pytest.fixture
def seed(monkeypatch):
    pkg = types.ModuleType("tiny_agent")
    pkg.model = tinychat.model
    monkeypatch.setitem(sys.modules, "tiny_agent", pkg)
    monkeypatch.setitem(sys.modules, "tiny_agent.model", tinychat.model)
    spec = importlib.util.spec_from_loader("user_decode", SourceFileLoader("user_decode", SEED))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _turn(mod, model, quant=None):
    if quant:
        mod.quantize_cpu(model, quant)
    cache = mod.KVCache(model, 1, 300, "cpu", dtype=torch.float32)
    dec = mod.Decoder(model, cache, graph=False)
    prompt = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(4))
    logits = mod.append(model, cache, prompt, [40])
    toks = dec.generate(logits, 40, 511, temperature=0.9, top_p=0.9, pen=1.2, pen_ids=[5, 6, 7],
                        generator=torch.Generator().manual_seed(1))
    return logits, toks, cache


def test_user_module_runs_unmodified_and_agrees_with_the_engine(seed):
    lu, tu, cu = _turn(seed, make_model())
    le, te, ce = _turn(E, make_model())
    assert torch.equal(lu, le)
    assert tu == te and len(tu) > 10
    assert torch.equal(cu.gk, ce.gk) and torch.equal(cu.lpos, ce.lpos)


def test_user_module_quantizes_tinychat_models_close_to_the_engine(seed):
    # the speed modes are ours to tune (bf16 prefill GEMMs, native int8 kernels): close, not bit-identical
    lu, tu, _ = _turn(seed, make_model(), "int8")
    le, te, _ = _turn(E, make_model(), "int8")
    assert ((lu - le).abs().max() / le.abs().max()).item() < 0.02
    assert len(tu) > 10 and len(te) > 10


def test_user_append_matches_the_full_forward(seed):
    model = make_model()
    x = torch.randint(0, 512, (2, 150), generator=torch.Generator().manual_seed(6))
    ref = model(x)
    cache = seed.KVCache(model, 2, 300, "cpu", dtype=torch.float32)
    a = seed.append(model, cache, x[:, :100], [100, 60])
    b = seed.append_chunked(model, cache, x[:, 100:], [50, 0])
    assert (a[1] - ref[1, 59]).abs().max() < 1e-3
    assert (b[0] - ref[0, 149]).abs().max() < 1e-3
