"""`tinychat import`: llama-family checkpoints (a Hugging Face folder or a GGUF file) -> a tinychat model folder
(config.json, model.safetensors, tokenizer.json, chat template + stop tokens) under the user's data folder.

    import_model(src, name=None, context=None, dtype="float32") -> Path of the new model folder

Refusals (unsupported architecture, missing file, unrecognised chat template) raise ImportRefused with one line."""
from .errors import ImportRefused
from .store import list_models, model_path, resolve

__all__ = ["ImportRefused", "import_model", "list_models", "model_path", "resolve"]


def import_model(*args, **kwargs):
    from .run import import_model as run
    return run(*args, **kwargs)
