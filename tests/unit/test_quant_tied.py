"""Stored-quantized files of a tied llama (quant_files.py, layout version 2): the file holds no embedding, the model's
embedding is the head's int8 rows times inv_gain (engine/head_embed.py), read by reference; the PyTorch module, its
float64 reference and the native llama step give the same bits; prefill and decode read the same rows; version-1
files (the embedding stored) still load and chat as quantizing at start; untied models keep their embedding."""
import shutil
import sys
from pathlib import Path

import pytest
import torch

from tinychat.engine import Decoder, KVCache, append, int8_kernel_ok, native, quantize_cpu
from tinychat.engine.head_embed import HeadRowsEmbedding, embed_rows
from tinychat.importer import import_model
from tinychat.loading import load_folder, load_runtime, open_chat
from tinychat.mapped import MappedWeights
from tinychat.model import CheckpointError, Embedding, TinyAgentLM
from tinychat.options import EngineOptions
from tinychat.norm_gains import GAINS_FILE
from tinychat.quant_files import QKV, TIED_KEY, VERSION_KEY, load_quantized, read_header, save_quantized
from tinychat.settings import ChatSettings

sys.path.insert(0, str(Path(__file__).parent))         # the import tests' tiny llama writers
from test_llama_import import PROMPT, VARIANTS, _weights, write_hf  # noqa: E402
from test_quant_files import _damage  # noqa: E402

MODES = ["int8", "int4"]
TIED_BIAS = {**VARIANTS["qwen2-bias-untied"], "tie_word_embeddings": True}     # Qwen2.5-0.5B's form: q/k/v biases
pytestmark = pytest.mark.skipif(not int8_kernel_ok(), reason="this torch build has no CPU int8 kernel")


def _src(tmp_path, variant="llama-tied", change=None):
    cfg = TIED_BIAS if variant == "qwen2-bias-tied" else VARIANTS[variant]
    w = _weights(cfg, qk_std=0.15)
    if change:
        change(w)
    return cfg, w, write_hf(tmp_path / "hf", cfg, w)


def _header(folder):
    h = read_header(folder / "model.safetensors")
    return h, h["__metadata__"]


@pytest.mark.parametrize("mode", MODES)
def test_a_tied_models_stored_file_has_no_embedding_and_reads_it_from_the_head_rows(tmp_path, mode):
    cfg, w, src = _src(tmp_path)
    full, packed = import_model(src, name="full"), import_model(src, name="p", quant=mode)
    h, meta = _header(packed)
    assert meta[VERSION_KEY] == ("4" if mode == "int4" else "3")        # int4: its per-layer mix (layout 4)
    assert "embed.weight" not in h and h[TIED_KEY]["shape"] == [cfg["hidden_size"]]
    m = load_quantized(packed)
    assert isinstance(m.embed, HeadRowsEmbedding) and m.embed.head is m.head
    mapped = MappedWeights()                                  # by reference: the head's mapped tensors, no table
    assert mapped.holds(m.embed.head.qweight) and mapped.holds(m.embed.head.scale)
    assert not [k for k in m.state_dict() if k.startswith("embed.") and k != TIED_KEY]
    g = w["model.norm.weight"].double()
    assert torch.equal(m.embed.inv_gain, (1.0 / g).float())
    # every other tensor is quantize_cpu's of the full-precision import (its norm gains kept apart), bit for bit
    want = quantize_cpu(load_folder(full, mode), mode, int8_head4=True).state_dict()  # int8 files: the head's copy
    have = m.state_dict()
    assert sorted(have) == sorted({*want, TIED_KEY} - {"embed.weight"})
    for k, v in want.items():
        assert k == "embed.weight" or torch.equal(have[k], v), k
    # the rows are the embedding up to the head's int8 rounding over the gain: |q s - e g| <= s / 2
    emb = w["model.embed_tokens.weight"].double()
    rows = m.embed(torch.arange(cfg["vocab_size"])).double()
    bound = 0.5 * m.head.scale.double()[:, None] / g.abs()[None, :]
    assert bool(((rows - emb).abs() <= bound * 1.001 + 1e-6).all())
    assert (rows - emb).abs().max() > 0                        # really the int8 rows, not the fp32 table


@pytest.mark.parametrize("variant", ["llama-tied", "qwen2-bias-tied"])
@pytest.mark.parametrize("mode", MODES)
def test_a_tied_models_file_holds_q_k_v_fused_and_a_load_runs_them_where_they_lie(tmp_path, mode, variant):
    _, _, src = _src(tmp_path, variant)
    full, packed = import_model(src, name="full"), import_model(src, name="p", quant=mode)
    h, meta = _header(packed)
    assert meta[VERSION_KEY] == ("4" if mode == "int4" else "3") and not [k for k in h if ".w_q." in k or ".w_kv_" in k]
    ref = quantize_cpu(load_folder(full, mode), mode)
    m = load_quantized(packed)
    mapped = MappedWeights()
    assert len(m.fused_qkv) == len(ref.fused_qkv) == len(m.blocks) == len([k for k in h if k.endswith(f"{QKV}.scale")])
    for i, (f, r, blk) in enumerate(zip(m.fused_qkv, ref.fused_qkv, m.blocks)):
        assert type(f) is type(r) and f"blocks.{i}.attn.{QKV}.qweight" in h
        for leaf in ("qweight", "scale", "bias", "in_gain"):  # quantize_cpu's fused rows, bit for bit
            a, b = getattr(f, leaf), getattr(r, leaf)
            assert (a is None) == (b is None) and (a is None or torch.equal(a, b)), (i, leaf)
        assert mapped.holds(f.qweight) and mapped.holds(f.scale)        # the file's own bytes: no copy
        for lin in (blk.attn.w_q, blk.attn.w_kv_global):                 # the q/k/v Linears: views of its rows
            assert lin.qweight.untyped_storage().data_ptr() == f.qweight.untyped_storage().data_ptr()
            assert lin.scale.untyped_storage().data_ptr() == f.scale.untyped_storage().data_ptr()
            assert lin.bias is None or lin.bias.untyped_storage().data_ptr() == f.bias.untyped_storage().data_ptr()
    have, want = m.state_dict(), ref.state_dict()                       # and the q/k/v Linears are quantize_cpu's
    for k in want:
        if ".attn.w_" in k:
            assert torch.equal(have[k], want[k]), k
    st = ChatSettings(max_new=8, temperature=0.0, seed=1)
    r = open_chat(load_runtime(packed, mode), mode, "cpu", st, {}, autosave=False).send("hello there")
    assert len(r.token_ids) > 3


def test_the_head_rows_embedding_gathers_the_bits_of_its_float64_reference():
    g = torch.Generator().manual_seed(3)

    class Head:
        qweight = torch.randint(-127, 128, (50, 40), dtype=torch.int8, generator=g)
        scale = (torch.rand(50, generator=g) * 0.1 + 1e-3).to(torch.bfloat16)

    inv = (1.0 / (torch.rand(40, generator=g).double() * 2 + 0.05)).float()
    inv[3] = -inv[3]
    e = HeadRowsEmbedding(Head, inv)
    idx = torch.randint(0, 50, (3, 7), generator=g)
    fast, naive = e(idx), e.naive_rows(idx)
    assert fast.shape == (3, 7, 40) and fast.dtype == torch.float32
    assert torch.equal(fast, naive)
    assert torch.equal(embed_rows(e, idx[0]), naive[0])
    assert not torch.equal(fast, (Head.qweight[idx].float() * Head.scale[idx].float()[..., None]))   # inv applied


def _materialized(m):
    """A copy of a version-2 model whose embedding is an fp32 table holding HeadRowsEmbedding's rows."""
    import copy
    c = copy.deepcopy(m)
    V, d = c.embed.num_embeddings, c.embed.embedding_dim
    table = m.embed.naive_rows(torch.arange(V))
    c.embed = Embedding(V, d)
    c.embed.weight = torch.nn.Parameter(table, requires_grad=False)
    return c


def _walk(model, n, native_on):
    opts = EngineOptions(native=native_on)
    from tinychat.quant_files import configure
    configure(model, opts)
    cache = KVCache(model, 1, 128, "cpu", dtype=torch.float32)
    dec = Decoder(model, cache, graph=False, options=opts)
    rows = [append(model, cache, torch.tensor([PROMPT]), [len(PROMPT)])]
    toks = []
    for _ in range(n):
        toks.append(int(rows[-1].argmax()))
        rows.append(dec.step(toks[-1]))
    return toks, torch.cat(rows), dec.cpu_step


@pytest.mark.parametrize("native_on", [True, False], ids=["native-step", "pytorch-step"])
@pytest.mark.parametrize("mode", MODES)
def test_prefill_and_both_steps_read_the_bits_of_the_head_rows_embedding(tmp_path, mode, native_on):
    if native_on and native.load() is None:
        pytest.skip(f"native kernels off: {native.why_not}")
    _, _, src = _src(tmp_path)
    m = load_quantized(import_model(src, name="p", quant=mode))
    ref = _materialized(m)
    toks, logits, step = _walk(m, 10, native_on)
    rtoks, rlogits, rstep = _walk(ref, 10, native_on)
    assert (step.nat is not None) == native_on and (rstep.nat is not None) == native_on
    assert len(set(toks)) > 2 and toks == rtoks
    assert torch.equal(logits, rlogits)         # the same embedding bits: prefill, and each decode step


def test_the_native_step_differs_where_the_embedding_rows_differ(tmp_path):
    """The bitwise comparison above can fail: the embedding row of a token off by one ulp changes the native step's
    logits."""
    if native.load() is None:
        pytest.skip(f"native kernels off: {native.why_not}")
    _, _, src = _src(tmp_path)
    m = load_quantized(import_model(src, name="p", quant="int4"))
    ref = _materialized(m)
    tok = PROMPT[-1]
    row = ref.embed.weight.data[tok]
    row.copy_(torch.nextafter(row, torch.full_like(row, 1e9)))
    out = []
    for model in (m, ref, _materialized(m)):    # the perturbed table, then the exact one
        cache = KVCache(model, 1, 64, "cpu", dtype=torch.float32)
        dec = Decoder(model, cache, graph=False, options=EngineOptions(native=True))
        out.append(dec.step(tok))
        assert dec.cpu_step.nat is not None
    assert not torch.equal(out[0], out[1]) and torch.equal(out[0], out[2])


@pytest.mark.parametrize("mode", MODES)
def test_a_chat_on_a_tied_stored_model_runs_the_stored_step_and_replays_exactly(tmp_path, mode, capsys):
    from test_quant_files import _main
    _, _, src = _src(tmp_path)
    full, packed = import_model(src, name="full"), import_model(src, name="p", quant=mode)
    st = ChatSettings(max_new=8, temperature=0.0, seed=1)
    opts = EngineOptions(head4=mode == "int4")     # an int8 file's two-level head is its own: off to compare
    a = open_chat(load_runtime(full, mode), mode, "cpu", st, {}, options=opts, autosave=False)
    b = open_chat(load_runtime(packed, mode), mode, "cpu", st, {}, options=opts, autosave=False)
    assert len(b.send("hello there").token_ids) > 3
    assert a.step_name() == b.step_name() and b.plan.quant == mode        # the same step (its rounding unchanged)
    code, _, err = _main(["--model", "p", "--max-new", "6", "--temperature", "0", "-p", "hi"], capsys)
    assert code == 0, err
    import json
    sid = json.loads(_main(["sessions", "--json"], capsys)[1])[0]["id"]
    code, out, err = _main(["replay", sid, "--check"], capsys)
    assert code == 0 and "token-exact" in out, err
    code, out, _ = _main(["info", "--model", "p", "--json"], capsys)
    facts = json.loads(out)
    assert code == 0 and facts["stored"] == mode and facts["embed_from_head"] is True
    code, out, _ = _main(["models"], capsys)
    assert code == 0 and f"stored {mode}" in out


def _as_v1(full: Path, dest: Path, mode: str) -> Path:
    """What an older tinychat wrote for the tied model: the layout-1 file (the fp32 embedding kept, the gains folded)."""
    shutil.copytree(full, dest)
    (dest / "model.safetensors").unlink()
    (dest / GAINS_FILE).unlink()
    save_quantized(TinyAgentLM.from_pretrained(full), dest, mode)        # no tied_gain, no in_gains: layout 1
    return dest


def _as_v2(full: Path, dest: Path, mode: str, gain: torch.Tensor) -> Path:
    """What the tinychat before issue #34's gains wrote for the tied model: layout 2 (the gains folded)."""
    shutil.copytree(full, dest)
    (dest / "model.safetensors").unlink()
    (dest / GAINS_FILE).unlink()
    m = TinyAgentLM.from_pretrained(full)
    m.tied_gain = gain
    save_quantized(m, dest, mode)
    return dest


def _older_import(full: Path, dest: Path) -> Path:
    """The full-precision import as a tinychat before issue #34's gains wrote it: no norm gains file (folded)."""
    shutil.copytree(full, dest)
    (dest / GAINS_FILE).unlink()
    return dest


@pytest.mark.parametrize("mode", MODES)
def test_a_version_1_file_of_a_tied_model_still_loads_and_chats_as_quantizing_at_start(tmp_path, mode):
    _, _, src = _src(tmp_path)
    full = import_model(src, name="full")
    v1 = _as_v1(full, tmp_path / "v1", mode)
    h, meta = _header(v1)
    assert meta[VERSION_KEY] == "1" and "embed.weight" in h and TIED_KEY not in h
    m = load_quantized(v1)
    assert type(m.embed) is Embedding
    st = ChatSettings(max_new=10, temperature=0.0, seed=1)
    opts = EngineOptions(head4=mode == "int4")     # an int8 file's two-level head is its own: off to compare
    a = open_chat(load_runtime(_older_import(full, tmp_path / "old"), mode), mode, "cpu", st, {}, options=opts,
                  autosave=False)
    b = open_chat(load_runtime(v1, mode), mode, "cpu", st, {}, options=opts, autosave=False)
    ra, rb = a.send("hello there"), b.send("hello there")
    assert len(ra.token_ids) > 3 and ra.token_ids == rb.token_ids and a.step_name() == b.step_name()


@pytest.mark.parametrize("mode", MODES)
def test_a_version_2_file_of_a_tied_model_still_loads_and_chats_folded(tmp_path, mode):
    _, w, src = _src(tmp_path)
    full = import_model(src, name="full")
    v2 = _as_v2(full, tmp_path / "v2", mode, w["model.norm.weight"].float())
    h, meta = _header(v2)
    assert meta[VERSION_KEY] == "2" and TIED_KEY in h and not [k for k in h if k.endswith(".in_gain")]
    m = load_quantized(v2)
    assert isinstance(m.embed, HeadRowsEmbedding) and all(f.in_gain is None for f in m.fused_qkv)
    assert all(type(f) is type(m.head) for f in m.fused_qkv)            # q/k/v int8 under int4 too, as before
    st = ChatSettings(max_new=10, temperature=0.0, seed=1)
    r = open_chat(load_runtime(v2, mode), mode, "cpu", st, {}, autosave=False).send("hello there")
    assert len(r.token_ids) > 3


def test_an_untied_model_and_a_gain_with_a_zero_keep_their_embedding(tmp_path):
    _, _, src = _src(tmp_path, "qwen2-bias-untied")
    h, meta = _header(import_model(src, name="untied", quant="int4"))
    assert meta[VERSION_KEY] == "4" and "embed.weight" in h and TIED_KEY not in h
    _, _, src = _src(tmp_path / "z", change=lambda w: w["model.norm.weight"].__setitem__(2, 0.0))
    folder = import_model(src, name="zero-gain", quant="int4")
    h, meta = _header(folder)
    assert meta[VERSION_KEY] == "4" and "embed.weight" in h and TIED_KEY not in h
    assert type(load_quantized(folder).embed) is Embedding


def _nan_gain(sd, meta):
    sd[TIED_KEY][1] = float("nan")


def _inf_head_scale(sd, meta):
    sd["head.scale"][0] = float("inf")


DAMAGES = {
    "nan-gain": (_nan_gain, f"{TIED_KEY} holds NaN"),
    "inf-head-scale": (_inf_head_scale, "head.scale holds NaN"),
    "gain-shape": (lambda sd, meta: sd.update({TIED_KEY: sd[TIED_KEY][:-1].clone()}), f"{TIED_KEY} is F32"),
    "gain-dtype": (lambda sd, meta: sd.update({TIED_KEY: sd[TIED_KEY].half()}), f"{TIED_KEY} is F16"),
    "v2-without-gain": (lambda sd, meta: (sd.pop(TIED_KEY), meta.update({VERSION_KEY: "2"})), f"missing {TIED_KEY}"),
    "v3-without-gain": (lambda sd, meta: sd.pop(TIED_KEY), "missing embed.weight"),
    "v3-without-in-gain": (lambda sd, meta: sd.pop("blocks.1.mlp.up.in_gain"), "missing blocks.1.mlp.up.in_gain"),
    "nan-in-gain": (lambda sd, meta: sd[f"blocks.0.attn.{QKV}.in_gain"].__setitem__(1, float("nan")),
                    "in_gain holds NaN"),
    "v1-without-embedding": (lambda sd, meta: meta.update({VERSION_KEY: "1"}), "missing blocks.0.attn.w_kv_global.qweight"),
    "nan-in-fused-qkv": (lambda sd, meta: sd[f"blocks.0.attn.{QKV}.scale"].__setitem__(1, float("nan")),
                         "blocks.0.attn.w_q.scale holds NaN"),
    "fused-qkv-rows": (lambda sd, meta: sd.update({f"blocks.1.attn.{QKV}.qweight":
                                                   sd[f"blocks.1.attn.{QKV}.qweight"][:-1].clone()}),
                       f"blocks.1.attn.{QKV}.qweight is I8"),
}


@pytest.mark.parametrize("case", list(DAMAGES))
def test_a_damaged_version_2_file_is_refused_in_one_line_naming_the_tensor(tmp_path, case, capsys):
    from test_quant_files import _main
    change, why = DAMAGES[case]
    _, _, src = _src(tmp_path)
    packed = import_model(src, name="p", quant="int8")
    _damage(packed, change)
    with pytest.raises(CheckpointError, match=why):
        load_quantized(packed)
    code, _, err = _main(["--model", "p", "-p", "hi", "--max-new", "2", "--no-save"], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1 and why in err, err
