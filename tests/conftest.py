import pytest
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


@pytest.fixture
def tiny():
    return make_model()


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYCHAT_HOME", str(tmp_path / "home"))
