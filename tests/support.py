"""Test helpers: small random models, a tiny trained tokenizer, chats on them."""
import torch

from tinychat.model import TinyAgentLM, config_for


def make_model(seed: int = 0, engram: bool = True, **overrides) -> TinyAgentLM:
    """A random `tiny` model; weights scaled up so logits are far from uniform (sampling tests need peaked
    distributions, equivalence tests need non-trivial attention)."""
    if not engram:
        overrides.setdefault("engram_orders", ())
        overrides.setdefault("engram_layers", ())
    m = TinyAgentLM(config_for("tiny", **overrides))
    m.reset_parameters(seed)
    with torch.no_grad():
        m.head.weight.mul_(8)
        m.embed.weight.mul_(20)
        for blk in m.blocks:
            if blk.engram is not None:
                blk.engram.table.weight.mul_(20)
    return m.eval()




_WORDS = ("the cat dog sun moon tree river stone bird fish red blue green small big happy quiet fast slow "
          "runs sees likes finds eats sings jumps sleeps over under near with and but because hello thanks "
          "what why how where when tell me about story poem water fire light night day").split()


def make_tokenizer(vocab_size: int = 400):
    """A byte-level BPE with the ChatML specials, trained on seeded nonsense sentences (fast, deterministic)."""
    import random

    from tinychat.tokenizer import train_bpe
    rng = random.Random(0)
    texts = [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 14))) + rng.choice(".?!") for _ in range(400)]
    texts += ["You are a helpful assistant.", "Hello! How can I help you today?", "naïve café — 日本語 😀"]
    return train_bpe(texts, vocab_size)


_TOK = None


def tokenizer():
    global _TOK
    if _TOK is None:
        _TOK = make_tokenizer()
    return _TOK


def make_chat_model(seed: int = 0):
    tok = tokenizer()
    m = make_model(seed=seed, vocab_size=tok.vocab_size)
    m.set_token_strings(tok.token_strings())
    return m


def make_chat(model=None, model_seed: int = 0, **kw):
    """A Chat on the tiny chat model; ChatSettings fields (seed, temperature, ...) go to the settings, the rest
    (max_len, graph, autosave, ...) to Chat."""
    from tinychat.chat.runtime import Chat, ChatSettings
    settings = kw.pop("settings", None) or ChatSettings(**{k: kw.pop(k) for k in list(kw)
                                                          if k in ChatSettings.__dataclass_fields__})
    kw.setdefault("max_len", 512)
    return Chat(model or make_chat_model(model_seed), tokenizer(), settings, model_name="tiny-test", **kw)


torch.set_num_threads(1)   # tiny models: one thread is fastest, and immune to other processes on the machine


LLAMA_OPTIONS = dict(swa_window=0, kv_group=1, mlp_kind="swiglu", qk_norm=False, logit_softcap=0.0, norm_eps=1e-5,
                     engram_orders=(), engram_layers=())


def make_llama_model(seed: int = 0, bias: bool = True, **overrides) -> TinyAgentLM:
    """A random `tiny` model with the llama-family options (every layer global, SwiGLU, no QK-norm, no softcap,
    a norm epsilon; q/k/v biases like Qwen2 when `bias`). Weights scaled up so attention and logits are peaked."""
    m = TinyAgentLM(config_for("tiny", **{**LLAMA_OPTIONS, "attn_bias": bias, **overrides}))
    m.reset_parameters(seed)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        m.embed.weight.mul_(20)
        m.head.weight.mul_(8)
        for blk in m.blocks:
            blk.attn.w_q.weight.mul_(4)
            blk.attn.w_kv_global.weight.mul_(4)
            for lin in (blk.attn.w_q, blk.attn.w_kv_global):
                if lin.bias is not None:
                    lin.bias.copy_(torch.randn(lin.bias.shape, generator=g))
    return m.eval()


def run_main(args, capsys):
    """`tinychat ARGS` through cli.main in this process: (exit code, stdout, stderr)."""
    import sys

    import pytest

    from tinychat.cli import main
    old = sys.argv
    sys.argv = ["tinychat", *map(str, args)]
    try:
        with pytest.raises(SystemExit) as e:
            main()
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return e.value.code, out.out, out.err
