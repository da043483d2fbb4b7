"""Where a training step runs (`train --device`, `generate --device`): "cpu" or an available CUDA device, checked
before anything loads, with a one-line error in the caller's own error class."""
from __future__ import annotations


def resolve_device(text: str, error: type[BaseException]) -> str:
    """'cpu' or an available 'cuda[:N]' (normalised); anything else raises error(one line)."""
    import torch
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise error(f"--device {text!r}: expected cpu or cuda[:N]") from None
    if dev.type == "cpu":
        return "cpu"
    if dev.type != "cuda":
        raise error(f"--device {text!r}: this step runs on cpu or cuda[:N]")
    if not torch.cuda.is_available():
        raise error(f"--device {text}: this torch ({torch.__version__}) sees no CUDA GPU")
    if (dev.index or 0) >= torch.cuda.device_count():
        raise error(f"--device {text}: there are {torch.cuda.device_count()} CUDA devices")
    return str(dev)
