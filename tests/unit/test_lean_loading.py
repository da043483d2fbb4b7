"""Loading a model to quantize it: Linear weights kept as stored (no fp32 copy), the same identity and the same int8
weights as the plain fp32 load, and --quant none still runs fp32."""
import hashlib
import json

import torch

from support import make_chat_model, tokenizer
from tinychat.chat.runtime import Chat, ChatSettings, model_identity
from tinychat.engine import quantize_cpu
from tinychat.model import TinyAgentLM


def _saved(tmp_path, dtype=torch.bfloat16):
    m = make_chat_model(seed=2)
    m.save_pretrained(tmp_path / "m", dtype=dtype)
    return tmp_path / "m"


def _identity_naive(model) -> str:
    """The identity as first defined: sha256 over the config and every fp32 state-dict tensor's bytes."""
    h = hashlib.sha256(json.dumps(model.cfg.to_dict(), sort_keys=True).encode())
    for k, v in sorted(model.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()


def test_stored_linears_stay_bf16_and_everything_else_is_fp32(tmp_path):
    m = TinyAgentLM.from_pretrained(_saved(tmp_path), stored_linears=True)
    lin = {n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear)}
    for name, p in m.named_parameters():
        owner = name.rsplit(".", 1)[0]
        assert p.dtype == (torch.bfloat16 if owner in lin else torch.float32), name


def test_a_lean_load_has_the_identity_and_int8_weights_of_the_plain_load(tmp_path):
    path = _saved(tmp_path)
    plain = TinyAgentLM.from_pretrained(path)
    lean = TinyAgentLM.from_pretrained(path, stored_linears=True)
    assert model_identity(lean) == model_identity(plain) == _identity_naive(plain)
    quantize_cpu(plain, "int8")
    quantize_cpu(lean, "int8")
    a, b = plain.state_dict(), lean.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def test_the_identity_of_an_in_memory_model_is_the_naive_one():
    m = make_chat_model(seed=3)
    assert model_identity(m) == _identity_naive(m)


def test_a_lean_load_chatting_unquantized_runs_fp32_and_matches_the_plain_load(tmp_path):
    path = _saved(tmp_path)
    st = ChatSettings(temperature=0.0, max_new=12)
    replies = []
    for lean in (False, True):
        m = TinyAgentLM.from_pretrained(path, stored_linears=lean)
        chat = Chat(m, tokenizer(), st, quant="none", autosave=False)
        assert all(p.dtype == torch.float32 for p in m.parameters())
        replies.append(chat.send("hello there").token_ids)
    assert replies[0] == replies[1]


def test_the_shipped_default_model_keeps_its_identity_when_loaded_lean():
    from tinychat.loading import default_model_path
    path = default_model_path()
    assert path is not None
    assert model_identity(TinyAgentLM.from_pretrained(path, stored_linears=True)) == \
        _identity_naive(TinyAgentLM.from_pretrained(path))
