"""The learned RMSNorm gains of an imported llama-family model, kept apart from the weights they are folded into
(issue #34): `model.in_gains`, {"blocks.{i}.attn": input_layernorm's gain, "blocks.{i}.mlp": post_attention_layernorm's}
(each (d,) fp32), left by the importer (importer/llama.py's build_model).

The fp32 weights stay folded (W' = W diag(g): the fp32 forward never reads the gains); quantize_cpu gives each
gain to the Linears it feeds (engine/quant.py's in_gain: the weights quantized with the gain divided out, the
activations multiplied by it: a few outlier gains no longer set a whole group's / row's scale). A full-precision
import stores them in GAINS_FILE beside model.safetensors (tensors "blocks.{i}.attn.in_gain", "blocks.{i}.mlp.in_gain"),
read back by loading.py; a folder without the file (an older import, the shipped model) runs as before, folded. A
stored-quantized file holds them as its Linears' own in_gain tensors (quant_files.py, layout version 3)."""
from __future__ import annotations

from pathlib import Path

GAINS_FILE = "norm_gains.safetensors"
SUFFIX = ".in_gain"


def gain_names(n_layers: int) -> list[str]:
    """The model.in_gains keys of a model of n_layers blocks, in order."""
    return [f"blocks.{i}.{kind}" for i in range(n_layers) for kind in ("attn", "mlp")]


def save_gains(model, folder: Path) -> None:
    """Write folder/GAINS_FILE (atomic) holding model.in_gains; nothing for a model without them."""
    gains = getattr(model, "in_gains", None)
    if not gains:
        return
    from safetensors.torch import save_file

    from .fsutil import atomic_write
    sd = {k + SUFFIX: v.detach().float().contiguous().clone() for k, v in gains.items()}
    atomic_write(Path(folder) / GAINS_FILE, lambda tmp: save_file(sd, str(tmp), metadata={"format": "pt"}))


def load_gains(model, folder: Path) -> None:
    """Set model.in_gains from folder/GAINS_FILE where there is one (CheckpointError, one line, for a file that does
    not match the model: other names, shapes or dtypes, or NaN / Inf values)."""
    path = Path(folder) / GAINS_FILE
    if not path.is_file():
        return
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from .model_config import CheckpointError
    try:
        sd = load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path}: unreadable safetensors file ({str(e).splitlines()[0][:120]})") from None
    want = {k + SUFFIX for k in gain_names(model.cfg.n_layers)}
    if set(sd) != want:
        odd = sorted(set(sd) ^ want)[:2]
        raise CheckpointError(f"{path}: norm gains do not match config.json ({', '.join(odd)})")
    d = model.cfg.d_model
    for k, v in sd.items():
        if v.dtype != torch.float32 or tuple(v.shape) != (d,):
            raise CheckpointError(f"{path}: {k} is {str(v.dtype).removeprefix('torch.')} {tuple(v.shape)}, "
                                  f"expected float32 ({d},)")
        if not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{path}: {k} holds NaN or infinite values (a damaged file)")
    model.in_gains = {k[:-len(SUFFIX)]: v.clone() for k, v in sd.items()}
