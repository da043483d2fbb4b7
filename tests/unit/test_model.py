"""TinyAgentLM: structure, checkpoints (safetensors only) and their errors."""
import json

import pytest
import torch

from support import make_model
from tinychat.model import (SIZES, CheckpointError, ModelConfig, TinyAgentLM, canonical_ids, config_for,
                            load_config)


def test_layer_modes_and_seed_attribute_names():
    m = make_model()
    c = m.cfg
    for i, blk in enumerate(m.blocks):
        assert blk.attn.mode == ("full" if i % c.kv_group == 0 else "local")
        assert (blk.attn.w_kv_global is not None) == (blk.attn.mode == "full")
        assert blk.attn.w_kv_local.weight.shape == (2 * c.n_kv_heads * c.head_dim, c.d_model)
        assert (blk.engram is not None) == (i in c.engram_layers)
    assert m.rope.cos.shape == (c.max_seq_len, c.head_dim // 2)
    assert m.cid_map.shape == (c.vocab_size,)
    assert len(m.engram_modules()) == len(c.engram_layers)


def test_named_sizes():
    assert TinyAgentLM(config_for("tiny")).num_params() < 1_000_000
    with torch.device("meta"):
        full = TinyAgentLM(config_for("full"))
    assert 130e6 < full.num_linear_params() < 140e6 and full.cfg.vocab_size == 32000
    assert set(SIZES) == {"tiny", "demo", "full"}


def test_kv_bytes_per_token_is_one_kv_per_group():
    c = config_for("full")
    assert c.kv_bytes_per_token(2) == c.n_groups * 2 * c.n_kv_heads * c.head_dim * 2
    assert c.gqa_kv_bytes_per_token(2) == c.kv_group * c.kv_bytes_per_token(2)


def test_forward_is_causal():
    m = make_model()
    x = torch.randint(0, 512, (1, 30))
    y = x.clone()
    y[0, 20:] = (y[0, 20:] + 1) % 512
    assert torch.equal(m(x)[0, :20], m(y)[0, :20])
    assert not torch.allclose(m(x)[0, 20:], m(y)[0, 20:])


def test_engram_context_changes_the_output_and_respects_canonical_ids():
    m = make_model()
    x = torch.randint(5, 512, (1, 12))
    base = m(x)
    y = x.clone()
    y[0, 5] = 4                                  # changes the n-gram context of positions 5..7
    assert not torch.allclose(base[0, 5:8], m(y)[0, 5:8])
    # two token ids with the same canonical id address the same Engram slots
    m.cid_map[7] = 3
    assert torch.equal(m.engram_addresses(torch.tensor([[1, 7, 2]]))[1], m.engram_addresses(torch.tensor([[1, 3, 2]]))[1])


def test_canonical_ids_merge_case_space_and_width_variants():
    cid = canonical_ids(["Hello", " hello", "HELLO", "ｈｅｌｌｏ", "world", " World"])
    assert cid.tolist() == [0, 0, 0, 0, 4, 4]


def test_save_load_round_trip_gives_identical_logits(tmp_path):
    m = make_model()
    (tmp_path / "tok.json").write_text("{}")
    m.save_pretrained(tmp_path / "ckpt", tokenizer_json=tmp_path / "tok.json")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["config.json", "model.safetensors",
                                                                      "tokenizer.json"]
    m2 = TinyAgentLM.from_pretrained(tmp_path / "ckpt")
    x = torch.randint(0, 512, (2, 40))
    assert torch.equal(m(x), m2(x))
    assert m2.cfg == m.cfg


def test_bf16_checkpoint_loads_close_to_fp32(tmp_path):
    m = make_model()
    m.save_pretrained(tmp_path / "c", dtype=torch.bfloat16)
    m2 = TinyAgentLM.from_pretrained(tmp_path / "c")
    x = torch.randint(0, 512, (1, 20))
    assert m2.embed.weight.dtype == torch.float32
    assert (m(x) - m2(x)).abs().max() < 0.5


def _one_line(e):
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError) as e:
        TinyAgentLM.from_pretrained(tmp_path / "nope")
    assert "no such model folder" in _one_line(e)


def test_malformed_config_is_a_clear_error(tmp_path):
    make_model().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as e:
        load_config(tmp_path)
    assert "malformed JSON" in _one_line(e)
    cfg = config_for("tiny").to_dict()
    for bad, expect in [({**cfg, "n_heads": 3}, "multiple of n_kv_heads"), ({**cfg, "d_model": "x"}, "d_model"),
                        ({k: v for k, v in cfg.items() if k != "vocab_size"}, "lacks vocab_size"),
                        ({**cfg, "colour": 1}, "unknown fields"), ([1, 2], "JSON object")]:
        (tmp_path / "config.json").write_text(json.dumps(bad))
        with pytest.raises(CheckpointError) as e:
            TinyAgentLM.from_pretrained(tmp_path)
        assert expect in _one_line(e)


def test_weights_not_matching_config_is_a_clear_error(tmp_path):
    make_model().save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "mlp_hidden": 256}))
    with pytest.raises(CheckpointError) as e:
        TinyAgentLM.from_pretrained(tmp_path)
    assert "shape" in _one_line(e)
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_layers": 5}))
    with pytest.raises(CheckpointError) as e:
        TinyAgentLM.from_pretrained(tmp_path)
    assert "missing" in _one_line(e)
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 20)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        TinyAgentLM.from_pretrained(tmp_path)
    assert "unreadable" in _one_line(e)


def test_config_round_trips_through_json():
    c = config_for("demo")
    assert ModelConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c
