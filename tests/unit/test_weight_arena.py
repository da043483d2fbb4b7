"""engine/weight_arena.py: the weights a decode step streams moved into one anonymous mapping advised for huge pages.
The same bytes (so the same logits and tokens), views kept views, a two-level head's int8 rows left where they are,
a second placement a no-op, and the plan's switch (EngineOptions.huge_pages, the kernel's THP mode)."""
import pytest
import torch

from support import make_llama_model, make_model
from tinychat.engine import Decoder, KVCache, append, quantize_cpu
from tinychat.engine import two_level_head as head4
from tinychat.engine import weight_arena
from tinychat.engine.quant import Int4Linear, Int8Linear
from tinychat.options import EngineOptions
from tinychat.plan import decide

TOKENS = torch.randint(0, 500, (1, 20), generator=torch.Generator().manual_seed(3))


def _on(t: torch.Tensor, model) -> bool:
    """Whether t's bytes lie on one of the model's arenas."""
    return any(a.data_ptr() <= t.data_ptr() < a.data_ptr() + a.numel() for a in getattr(model, "weight_arenas", []))


def _greedy(model, n=12):
    """Prefill's last logits and n greedy tokens through the chat's Decoder."""
    V = model.cfg.vocab_size
    cache = KVCache(model, 1, 64, torch.device("cpu"))
    logits = append(model, cache, TOKENS, [TOKENS.size(1)])
    first = logits.clone()
    out = Decoder(model, cache).generate(logits, n, V - 1, temperature=0.0, top_p=1.0, ban_ids=(V - 1,))
    return first, out


def _shares(model) -> list[bool]:
    """Per block: does the q piece view its fused q/k/v rows (one storage)?"""
    return [blk.attn.w_q.qweight.untyped_storage().data_ptr() == f.qweight.untyped_storage().data_ptr()
            for blk, f in zip(model.blocks, model.fused_qkv)]


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_streamed_weights_move_keeping_their_bytes_views_and_tokens(quant):
    m = quantize_cpu(make_llama_model(vocab_size=4096), quant, int8_head4=True)
    assert head4.active(m.head)
    before = {n: b.clone() for n, b in m.named_buffers()}
    shares = _shares(m)
    logits, tokens = _greedy(m)
    moved = weight_arena.place(m, head4=True, min_bytes=0)
    assert moved > 0 and len(m.weight_arenas) == 1
    packed = [mod for mod in [*m.modules(), *m.fused_qkv] if type(mod) in (Int8Linear, Int4Linear) and mod is not m.head]
    assert packed and all(_on(p.qweight, m) and _on(p.scale, m) for p in packed)
    assert _on(m.head.q4weight, m) and _on(m.head.q4scale, m)
    assert not _on(m.head.qweight, m)                   # the two-level head's int8 rows: a few read a token
    for name, b in m.named_buffers():
        assert torch.equal(b, before[name]), name
    assert _shares(m) == shares and any(shares)         # views of the fused rows stay views
    logits2, tokens2 = _greedy(m)
    assert torch.equal(logits, logits2) and tokens == tokens2
    assert weight_arena.place(m, head4=True, min_bytes=0) == moved and len(m.weight_arenas) == 1


def test_an_int8_head_that_scans_itself_moves_and_small_models_stay_put():
    m = quantize_cpu(make_model(), "int8")               # TinyAgentLM: its int8 head is read whole every token
    assert not head4.active(m.head)
    assert weight_arena.place(m, head4=False) == 0 and not getattr(m, "weight_arenas", [])   # under MIN_BYTES
    assert weight_arena.place(m, head4=False, min_bytes=0) > 0
    assert _on(m.head.qweight, m) and _on(m.head.scale, m)


def test_the_kernels_mode_decides_whether_an_arena_is_made(tmp_path):
    f = tmp_path / "enabled"
    for text, mode in (("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"),
                       ("always madvise [never]\n", "never")):
        f.write_text(text)
        assert weight_arena.thp_mode(str(f)) == mode
    assert weight_arena.thp_mode(str(tmp_path / "missing")) is None


def test_the_plan_places_the_weights_unless_the_option_is_off(monkeypatch):
    monkeypatch.setattr(weight_arena, "available", lambda: True)
    monkeypatch.setattr(weight_arena, "MIN_BYTES", 0)
    on = decide(make_llama_model(vocab_size=4096), "int4", "cpu", EngineOptions())
    off = decide(make_llama_model(vocab_size=4096), "int4", "cpu", EngineOptions(huge_pages=False))
    assert on.huge_pages > 0 and off.huge_pages == 0
    assert EngineOptions.from_env({"TINYCHAT_HUGE_PAGES": "0"}).huge_pages is False
    monkeypatch.setattr(weight_arena, "available", lambda: False)
    assert decide(make_llama_model(vocab_size=4096), "int4", "cpu", EngineOptions()).huge_pages == 0


def test_a_one_shot_leaves_its_weights_where_they_load_unless_told():
    from tinychat.cli import engine_options
    assert engine_options({}, one_shot=False, env={}).huge_pages is True          # the app, plain chats, serve
    assert engine_options({}, one_shot=True, env={}).huge_pages is False          # -p / -f: the start is the speed
    assert engine_options({}, one_shot=True, env={"TINYCHAT_HUGE_PAGES": "1"}).huge_pages is True
    assert engine_options({}, one_shot=False, env={"TINYCHAT_HUGE_PAGES": "0"}).huge_pages is False
    assert engine_options({"tune_threads": False}, one_shot=True, env={}).tune_threads is False
