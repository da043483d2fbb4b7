"""Which chat format a checkpoint's chat template (Jinja text) describes, without running Jinja.

The engine frames turns from token ids (tokenizer.py): it needs the format's name, its stop tokens and the default
system prompt the template inserts when a chat has none. Recognised: ChatML (`<|im_start|>role\\n...<|im_end|>\\n`:
SmolLM2, Qwen2.5, most small instruct models). Other formats (Llama 3's header tokens, Mistral's [INST], Gemma's
turns) are refused by name.
Also recognised: Llama 3's header tokens (`<|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>`, with
`<|begin_of_text|>` before the system message), stop token `<|eot_id|>`."""
from __future__ import annotations

import re

from .errors import ImportRefused

CHATML = "chatml"
LLAMA3 = "llama3"
_KNOWN_OTHERS = {"[INST]": "Mistral / Llama 2 ([INST])",
                 "<start_of_turn>": "Gemma (<start_of_turn>)", "<|user|>": "Zephyr / Phi (<|user|>)"}


def detect(template: str | None, stops: list[str]) -> dict:
    """{"format", "stop_tokens", "default_system"} for a chat template; ImportRefused when it is not ChatML."""
    if not template:
        raise ImportRefused("the checkpoint has no chat template (not an instruct / chat model?)")
    if "<|im_start|>" in template and "<|im_end|>" in template:
        m = re.search(r"<\|im_start\|>system\\n(.*?)<\|im_end\|>", template) or \
            re.search(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", template, re.S)
        default = m.group(1) if m and "{{" not in m.group(1) and "{%" not in m.group(1) else None
        stop = ["<|im_end|>"] + [s for s in stops if s != "<|im_end|>"]
        return {"format": CHATML, "stop_tokens": stop, "default_system": default}
    if "<|start_header_id|>" in template and "<|eot_id|>" in template:
        stop = ["<|eot_id|>"] + [s for s in stops if s != "<|eot_id|>"]
        return {"format": LLAMA3, "stop_tokens": stop, "default_system": None}
    for marker, name in _KNOWN_OTHERS.items():
        if marker in template:
            raise ImportRefused(f"chat template {name} is not supported yet (supported: ChatML, Llama 3)")
    raise ImportRefused("chat template not recognised (supported: ChatML, Llama 3)")
