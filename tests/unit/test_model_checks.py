"""Issue #33 items 5 and 6, and the importer's "Also" items: a checkpoint's metadata is compared with its tensors before
anything is built (a 113 KB GGUF claiming 100,000 layers spent 79 s, one claiming an MLP 2^24 wide allocated 4.4 GB,
because the model was built, with random weights, first), weights holding NaN / Inf are refused at import and at
load naming the tensor, config numbers must be numbers, and a model folder never brings in files from elsewhere."""
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from support import LLAMA_OPTIONS, make_chat_model, make_model, tokenizer
from work import lines_run

from tinychat import model as M
from tinychat.importer import ImportRefused, import_model
from tinychat.loading import LoadError, load_runtime
from tinychat.model import CheckpointError, TinyAgentLM, config_for, state_shapes

# the importer tests' writers of Hugging Face folders and GGUF files (test files are not importable by name here)
_spec = importlib.util.spec_from_file_location("_llama_writers", Path(__file__).with_name("test_llama_import.py"))
_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_llama)
_config, _weights, write_gguf, write_hf = _llama._config, _llama._weights, _llama.write_gguf, _llama.write_hf
# Work bounds, not clocks (tests/work.py): lines of tinychat a refusal may run. A good load runs ~5,000, a good import
# ~3,500 (a GGUF ~21,000); a loop over what a config only claims (10^9 layers) spends these at once.
LOAD_LINES, IMPORT_LINES = 20_000, 60_000


@pytest.mark.parametrize("over", [
    {}, {"engram_orders": (), "engram_layers": ()}, {"kv_group": 1}, {"kv_group": 4, "n_layers": 6},
    {"engram_layers": (0, 3), "engram_orders": (2, 3, 4)}, {**LLAMA_OPTIONS, "attn_bias": True},
    {**LLAMA_OPTIONS, "attn_bias": False, "n_kv_heads": 4},
])
def test_the_shapes_a_config_implies_are_the_built_models(over):
    cfg = config_for("tiny", **over)
    built = {k: (tuple(v.shape), v.is_floating_point()) for k, v in TinyAgentLM(cfg).state_dict().items()}
    assert state_shapes(cfg) == built and M.state_count(cfg) == len(built)


def test_the_shipped_sizes_shapes_too():
    cfg = config_for("demo")
    with torch.device("meta"):
        built = {k: (tuple(v.shape), v.is_floating_point()) for k, v in TinyAgentLM(cfg).state_dict().items()}
    assert state_shapes(cfg) == built


@pytest.fixture
def folder(tmp_path):
    d = tmp_path / "model"
    make_chat_model().save_pretrained(d)
    tokenizer().save(d / "tokenizer.json")
    return d


def _edit_config(folder, **over):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(over)
    (folder / "config.json").write_text(json.dumps(cfg))


def _never_built(monkeypatch):
    def boom(self, *a, **k):
        raise AssertionError("the model was built before its tensors were compared with its config")
    monkeypatch.setattr(TinyAgentLM, "__init__", boom)


@pytest.mark.parametrize("over, words", [
    ({"n_layers": 100000}, "weights do not match config.json (it implies 550,008 tensors, the file holds 30)"),
    ({"n_layers": 5}, "weights do not match config.json (missing blocks.4."),
    ({"n_layers": 10 ** 9}, "weights do not match config.json (it implies"),
    ({"mlp_hidden": 2 ** 24}, "blocks.0.mlp.up.weight has shape (192, 64), config.json implies (16777216, 64)"),
    ({"vocab_size": 10 ** 7}, "has shape"),
    ({"engram_table_size": 10 ** 8 + 7}, "engram.table.weight has shape"),
])
def test_a_config_claiming_a_huge_model_is_refused_before_anything_is_built(folder, monkeypatch, over, words):
    _edit_config(folder, **over)
    _never_built(monkeypatch)
    with pytest.raises(CheckpointError) as e:
        lines_run(lambda: TinyAgentLM.from_pretrained(folder), budget=LOAD_LINES)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_context_beyond_the_rope_tables_ceiling_is_refused(folder):
    _edit_config(folder, max_seq_len=10 ** 9)
    with pytest.raises(CheckpointError, match="max_seq_len must be at most 131,072"):
        TinyAgentLM.from_pretrained(folder)


def _poison(path, name, value=float("nan")):
    sd = load_file(str(path))
    sd[name] = sd[name].clone()
    sd[name].view(-1)[7] = value
    save_file(sd, str(path), metadata={"format": "pt"})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_model_with_a_nan_or_inf_weight_is_refused_at_load_naming_it(folder, value):
    _poison(folder / "model.safetensors", "blocks.2.mlp.up.weight", value)
    with pytest.raises(CheckpointError, match="blocks.2.mlp.up.weight holds NaN or infinite values"):
        TinyAgentLM.from_pretrained(folder)
    for quant in ("none", "int8"):
        with pytest.raises(LoadError, match="blocks.2.mlp.up.weight holds NaN or infinite values"):
            load_runtime(folder, quant)


def test_a_model_file_replaced_by_one_with_nan_is_refused_although_its_identity_was_cached(folder):
    load_runtime(folder)                               # hashed and found finite: the identity is remembered
    data = (folder / "model.safetensors").read_bytes()
    os.unlink(folder / "model.safetensors")
    (folder / "model.safetensors").write_bytes(data)   # another file (inode), as an import --force writes it
    _poison(folder / "model.safetensors", "head.weight")
    with pytest.raises(LoadError, match="head.weight holds NaN"):
        load_runtime(folder)


# -- the importer ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("over, words", [
    ({"num_hidden_layers": 20000}, "weights lack model.layers.3."),
    ({"intermediate_size": 2 ** 24}, "mlp.gate_proj.weight has shape (96, 64), the config implies (16777216, 64)"),
    ({"hidden_size": 4096}, "has shape"),
])
def test_an_hf_config_claiming_a_huge_model_is_refused_before_it_is_built(tmp_path, monkeypatch, over, words):
    src = write_hf(tmp_path / "hf", {**_config("llama"), **over}, _weights(_config("llama")))
    _never_built(monkeypatch)
    with pytest.raises(ImportRefused) as e:
        lines_run(lambda: import_model(src, name="x"), budget=IMPORT_LINES)
    assert words in str(e.value)


@pytest.mark.parametrize("over", [{"num_hidden_layers": 100000}, {"intermediate_size": 2 ** 24}])
def test_a_small_gguf_claiming_a_huge_model_is_refused_at_once(tmp_path, monkeypatch, over):
    pytest.importorskip("gguf")
    cfg = _config("llama")
    src = write_gguf(tmp_path / "claims.gguf", {**cfg, **over}, _weights(cfg))
    _never_built(monkeypatch)
    with pytest.raises(ImportRefused, match="weights lack|has shape"):
        lines_run(lambda: import_model(src, name="x"), budget=IMPORT_LINES)


@pytest.mark.parametrize("tensor, value", [("model.layers.0.self_attn.q_proj.weight", float("nan")),
                                           ("model.embed_tokens.weight", float("inf")),
                                           ("model.layers.2.mlp.down_proj.weight", float("-inf"))])
def test_an_import_with_a_nan_or_inf_weight_is_refused_naming_it(tmp_path, tensor, value):
    cfg = _config("llama")
    w = _weights(cfg)
    w[tensor].view(-1)[3] = value
    with pytest.raises(ImportRefused, match=f"{tensor} holds NaN or infinite values"):
        import_model(write_hf(tmp_path / "hf", cfg, w), name="x")
    assert not (tmp_path / "home" / "models" / "x").exists()


def test_gains_that_overflow_when_folded_in_are_refused(tmp_path):
    cfg = _config("llama")
    w = _weights(cfg)
    w["model.layers.1.input_layernorm.weight"] = torch.full_like(w["model.layers.1.input_layernorm.weight"], 3e38)
    w["model.layers.1.self_attn.q_proj.weight"] *= 100
    with pytest.raises(ImportRefused, match="blocks.1.attn.w_q.weight holds NaN or infinite values after"):
        import_model(write_hf(tmp_path / "hf", cfg, w), name="x")


@pytest.mark.parametrize("key, value", [("hidden_size", "64"), ("hidden_size", 64.7), ("hidden_size", True),
                                        ("num_hidden_layers", [3]), ("num_attention_heads", 0),
                                        ("rope_theta", "1e4"), ("rms_norm_eps", None), ("intermediate_size", 96.0)])
def test_config_numbers_must_be_numbers_of_the_right_kind(tmp_path, key, value):
    cfg = {**_config("llama"), key: value}
    with pytest.raises(ImportRefused) as e:
        import_model(write_hf(tmp_path / "hf", cfg, _weights(_config("llama"))), name="x")
    assert key in str(e.value) and "\n" not in str(e.value)


def _sharded(tmp_path, names):
    src = write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama")))
    os.unlink(src / "model.safetensors")
    save_file({k: v.contiguous() for k, v in _weights(_config("llama")).items()}, str(tmp_path / "outside.st"))
    (src / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "model.embed_tokens.weight": names}}))
    return src


@pytest.mark.parametrize("shard", ["../outside.st", "/etc/passwd", "sub/../../outside.st", ""])
def test_index_shard_names_must_lie_inside_the_folder(tmp_path, shard):
    with pytest.raises(ImportRefused, match="not a file name inside the folder"):
        import_model(_sharded(tmp_path, shard), name="x")


def test_a_linked_file_outside_the_folder_is_refused_not_copied_in(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("{% for m in messages %}{{ m.content }}{% endfor %} <|im_start|> <|im_end|>")
    src = write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama")))
    (src / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    (src / "chat_template.jinja").symlink_to(secret)
    with pytest.raises(ImportRefused, match="a link to a file outside the model folder"):
        import_model(src, name="x")
    assert not (tmp_path / "home" / "models" / "x").exists()


def test_a_hugging_face_cache_snapshot_whose_files_link_to_its_blobs_imports(tmp_path):
    repo = tmp_path / "hub" / "models--org--tiny"
    src = write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama")))
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in src.iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        f.rename(blob)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    assert import_model(snap, name="cached").is_dir()


@pytest.mark.parametrize("tcfg, words", [
    ([1, 2], "not a JSON object"),
    ({"chat_template": [1, {"name": "default", "template": 5}]}, "chat_template is not a template"),
    ({"chat_template": 42}, "chat_template is not a template"),
    ({"eos_token": ["<|im_end|>"]}, "eos_token is neither"),
])
def test_a_malformed_tokenizer_config_is_refused_in_words_not_python_internals(tmp_path, tcfg, words):
    src = write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama")))
    (src / "tokenizer_config.json").write_text(json.dumps(tcfg))
    with pytest.raises(ImportRefused) as e:
        import_model(src, name="x")
    assert words in str(e.value) and "object has no attribute" not in str(e.value)


@pytest.mark.parametrize("generation", [[1, 2], "x"])
def test_a_malformed_generation_config_is_refused_in_words(tmp_path, generation):
    src = write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama")))
    (src / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(ImportRefused, match="not a JSON object"):
        import_model(src, name="x")


def test_malformed_gguf_merges_are_refused_in_words(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    real = gguf.GGUFWriter.add_token_merges
    monkeypatch.setattr(gguf.GGUFWriter, "add_token_merges", lambda self, m: real(self, ["nospace", *m[1:]]))
    src = write_gguf(tmp_path / "bad.gguf", _config("llama"), _weights(_config("llama")))
    with pytest.raises(ImportRefused, match="merges: 'nospace' is not two tokens"):
        import_model(src, name="x")


def test_the_model_module_refuses_nonfinite_weights_of_a_model_in_memory():
    m = make_model()
    assert M.first_nonfinite(m) is None
    with torch.no_grad():
        m.blocks[1].attn.w_o.weight[0, 0] = float("nan")
    assert M.first_nonfinite(m) == "blocks.1.attn.w_o.weight"


def test_weights_about_to_be_loaded_are_never_randomly_initialised(folder, tmp_path, monkeypatch):
    """Item 5's last clause: a load (from_pretrained) and an import build their model without the random init its
    weights would get only to be replaced (it wrote every page of the fp32 weights). Counted, not timed."""
    calls = []
    for fn in ("kaiming_uniform_", "normal_", "uniform_"):
        real = getattr(torch.nn.init, fn)
        monkeypatch.setattr(torch.nn.init, fn, lambda *a, _real=real, _fn=fn, **k: calls.append(_fn) or _real(*a, **k))
    real_reset = TinyAgentLM.reset_parameters
    monkeypatch.setattr(TinyAgentLM, "reset_parameters", lambda self, *a, **k: calls.append("model") or
                        real_reset(self, *a, **k))
    make_chat_model()
    assert calls                                        # a model built from scratch is initialised: the count works
    calls.clear()
    TinyAgentLM.from_pretrained(folder)
    import_model(write_hf(tmp_path / "hf", _config("llama"), _weights(_config("llama"))), name="x")
    assert calls == []
