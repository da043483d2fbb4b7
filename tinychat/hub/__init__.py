"""Models from the Hugging Face Hub, through `huggingface_hub` (the field's client) and its standard cache.

    ref.py       REPO[:QUANT][@REVISION] and which GGUF file a quant names (no huggingface_hub)
    cache.py     the HF cache (HF_HOME / HF_HUB_CACHE): which repos in it tinychat can import, a repo's snapshot
    precheck.py  refusing a model from its config.json / GGUF header, before its weights download
    transfer.py  downloading a plan's files (progress from the bytes on disk, a killed download's part resumed)
    pull.py      `tinychat pull`: plan, check, size and disk space, download, then the importer (importer/)

huggingface_hub is imported inside the functions: `tinychat --help`, `tinychat models` and the chat never pay for
it. Errors are PullError, one line for the CLI."""
from .errors import PullError

__all__ = ["DEMO_NOTE", "PullError", "RECOMMENDED", "RECOMMENDED_PULL"]

# The small instruct model the first run points at (measured on this project's 2-vCPU machine: docs/benchmarks.md)
RECOMMENDED = "HuggingFaceTB/SmolLM2-360M-Instruct"
RECOMMENDED_NAME = RECOMMENDED.split("/")[1]
# stored packed int8 (what --quant auto runs on a CPU): a quarter of the float32 folder, nothing quantized at start
RECOMMENDED_PULL = f"tinychat pull {RECOMMENDED} --quant int8"
DEMO_NOTE = (f"The shipped model is a 21.7M-parameter demo: fluent, not a source of facts. A real one: "
             f"`{RECOMMENDED_PULL}`, then `tinychat -m {RECOMMENDED_NAME}`.")
