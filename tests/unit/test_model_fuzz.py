"""Fuzz (issue #33): model metadata against tensors. A seeded loop damages a model folder's config.json and weights
(and a Hugging Face folder's, through `tinychat import`): a field set to a huge, negative, fractional, text or
boolean value, a tensor dropped, reshaped, added or holding NaN / Inf. The properties:
- loading and importing either work or refuse with one line (CheckpointError / ImportRefused), never another
  exception;
- a model is only ever built with exactly the tensors its file holds (its state's size is the file's), so no
  metadata can make tinychat allocate more than the file brings;
- each case is bounded in work (tests/work.py: lines of tinychat run, not time): a refusal or a load of this tiny
  model runs a few thousand lines, where a loop over a claimed 100,000 layers ran minutes."""
import importlib.util
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from support import make_chat_model, tokenizer
from work import lines_run

from tinychat.importer import ImportRefused, import_model
from tinychat.model import CheckpointError, TinyAgentLM

CASES = 120
LOAD_LINES, IMPORT_LINES = 20_000, 60_000     # a good load runs ~5,000 lines of tinychat, an import ~3,500
POOL = [0, -1, 1, 3, 7, 2 ** 24, 100000, 10 ** 9, 2 ** 63, 1.5, 64.7, "32", "", True, None, [], [3], {}, float("nan"),
        1e308]
_spec = importlib.util.spec_from_file_location("_llama_writers", Path(__file__).with_name("test_llama_import.py"))
_llama = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_llama)


class Built:
    """Every TinyAgentLM built meanwhile, by the size of its saved state (persistent tensors, elements)."""

    def __init__(self, monkeypatch):
        self.sizes: list[int] = []
        real = TinyAgentLM.__init__

        def init(model, *a, **k):
            real(model, *a, **k)
            self.sizes.append(sum(t.numel() for t in model.state_dict().values()))
        monkeypatch.setattr(TinyAgentLM, "__init__", init)


def _file_elements(path: Path) -> int:
    with safe_open(str(path), "pt") as f:
        return sum(int(torch.tensor(f.get_slice(k).get_shape()).prod()) for k in f.keys())


def _damage_tensors(rng, path: Path) -> None:
    sd = load_file(str(path))
    name = rng.choice(sorted(sd))
    kind = rng.randrange(4)
    if kind == 0:
        del sd[name]
    elif kind == 1:
        t = sd[name]
        sd[name] = torch.zeros(*(s + rng.choice([-1, 1, 7]) if s > 1 else s for s in t.shape), dtype=t.dtype)
    elif kind == 2:
        sd[f"blocks.{rng.randrange(1, 99)}.extra.weight"] = torch.zeros(3, 3)
    elif sd[name].is_floating_point():
        sd[name] = sd[name].clone()
        sd[name].view(-1)[0] = rng.choice([float("nan"), float("inf"), float("-inf")])
    save_file(sd, str(path), metadata={"format": "pt"})


def test_damaged_model_folders_load_or_refuse_in_one_line_without_building_beyond_their_file(tmp_path, monkeypatch):
    good = tmp_path / "good"
    make_chat_model().save_pretrained(good)
    tokenizer().save(good / "tokenizer.json")
    cfg = json.loads((good / "config.json").read_text())
    built = Built(monkeypatch)
    rng = random.Random(33)
    outcomes = {"loaded": 0, "refused": 0}
    for n in range(CASES):
        case = tmp_path / f"case{n}"
        shutil.copytree(good, case)
        if rng.random() < 0.6:
            bad = dict(cfg)
            for _ in range(rng.randint(1, 2)):
                bad[rng.choice(sorted(cfg))] = rng.choice(POOL)
            (case / "config.json").write_text(json.dumps(bad))
        else:
            _damage_tensors(rng, case / "model.safetensors")
        built.sizes.clear()
        try:
            lines_run(lambda: TinyAgentLM.from_pretrained(case), budget=LOAD_LINES)
            outcomes["loaded"] += 1
        except CheckpointError as e:
            assert "\n" not in str(e) and str(e).strip(), (n, str(e))
            outcomes["refused"] += 1
        assert all(size == _file_elements(case / "model.safetensors") for size in built.sizes), (n, built.sizes)
        shutil.rmtree(case)
    print(f"model fuzz: {outcomes}")
    assert outcomes["refused"] > CASES // 2 and outcomes["loaded"] > 0


def test_damaged_hugging_face_folders_import_or_refuse_in_one_line(tmp_path, monkeypatch):
    cfg = _llama._config("llama")
    weights = _llama._weights(cfg)
    built = Built(monkeypatch)
    rng = random.Random(34)
    outcomes = {"imported": 0, "refused": 0}
    keys = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
            "intermediate_size", "rope_theta", "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings"]
    for n in range(CASES // 3):
        bad_cfg, w = dict(cfg), dict(weights)
        if rng.random() < 0.6:
            bad_cfg[rng.choice(keys)] = rng.choice(POOL)
        else:
            name = rng.choice(sorted(w))
            t = w[name].clone()
            if rng.random() < 0.5:
                t.view(-1)[0] = float("nan")
            else:
                t = torch.zeros(*(s + 1 for s in t.shape))
            w[name] = t
        src = _llama.write_hf(tmp_path / f"hf{n}", bad_cfg, w)
        built.sizes.clear()
        try:
            lines_run(lambda: import_model(src, name=f"m{n}"), budget=IMPORT_LINES)
            outcomes["imported"] += 1
        except ImportRefused as e:
            assert "\n" not in str(e) and str(e).strip(), (n, str(e))
            outcomes["refused"] += 1
        elements = sum(v.numel() for v in w.values())
        assert all(size <= 2 * elements + 10 ** 5 for size in built.sizes), (n, built.sizes, elements)
        shutil.rmtree(src)
    print(f"import fuzz: {outcomes}")
    assert outcomes["refused"] > 0 and outcomes["imported"] > 0


@pytest.mark.parametrize("layers", [100000, 2 ** 20])
def test_a_claim_of_many_layers_costs_nothing(tmp_path, monkeypatch, layers):
    good = tmp_path / "good"
    make_chat_model().save_pretrained(good)
    cfg = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**cfg, "n_layers": layers}))
    built = Built(monkeypatch)
    with pytest.raises(CheckpointError, match="weights do not match"):
        lines_run(lambda: TinyAgentLM.from_pretrained(good), budget=1_000)     # refused by the count: ~220 lines
    assert built.sizes == []
