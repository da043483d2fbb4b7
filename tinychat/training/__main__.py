"""``python -m tinychat.training STEP ...``: the pipeline that makes the default model.

Steps are modules of this package, imported only when chosen (the teacher needs ``gguf``/numpy,
training needs more; ``--help`` needs nothing). Each module provides ``add_arguments(parser)`` and
``run(args) -> int``. Add a step by adding a line to :data:`STEPS`.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys

STEPS = {
    "generate": ("tinychat.training.generate", "teacher conversations -> data/shards/*.jsonl.gz"),
    "tokenizer": ("tinychat.training.tokenizer", "train the byte-level BPE tokenizer on the shards"),
    "train": ("tinychat.training.train_cli", "train the student model"),
    "export": ("tinychat.training.export", "write the model, tokenizer and card to assets/"),
    "eval": ("tinychat.training.evaluate", "quality bar and losses on held-out conversations"),
    "stats": ("tinychat.training.stats", "how diverse the user messages of the shards are"),
    "questions": ("tinychat.training.selfinstruct", "the teacher writes user questions for sampled topics"),
    "probe": ("tinychat.training.probe", "does the model answer the question asked (checkable answers)"),
    "arithmetic": ("tinychat.training.arithmetic", "small sums with exact answers, written by a program"),
    "onpolicy": ("tinychat.training.onpolicy", "the student's own replies, the best of K as the teacher reads them"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    top = argparse.ArgumentParser(prog="python -m tinychat.training",
                                  description="Build the default tinychat model, step by step.")
    sub = top.add_subparsers(dest="step", metavar="STEP", required=True)
    for name, (_, help_) in STEPS.items():
        sub.add_parser(name, help=help_, add_help=False)
    if not argv or argv[0] not in STEPS:
        top.parse_args(argv)          # usage, --help, or "invalid choice"
        return 2
    name = argv[0]
    try:
        module = importlib.import_module(STEPS[name][0])
    except ModuleNotFoundError as e:
        if e.name == STEPS[name][0]:
            top.exit(2, f"step {name!r} is not implemented yet ({STEPS[name][0]})\n")
        raise
    p = argparse.ArgumentParser(prog=f"python -m tinychat.training {name}",
                                description=module.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    module.add_arguments(p)
    args = p.parse_args(argv[1:])
    args.command_line = "python -m tinychat.training " + shlex.join(argv)     # for the records the step writes
    try:
        return int(module.run(args) or 0)
    except (ValueError, RuntimeError, OSError) as e:
        # bad input (our own errors: a missing tokenizer, a broken shard, ...) and the file system: one line;
        # anything else (torch's RuntimeErrors included) is a bug, with its traceback
        if not (isinstance(e, OSError) or type(e).__module__.startswith("tinychat.")):
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        p.exit(1, f"{p.prog}: error: {msg}\n")


if __name__ == "__main__":
    if sys.argv[1:2] and sys.argv[1] in STEPS and not {"-h", "--help"} & set(sys.argv[2:]):
        from .mkl_dispatch import reexec
        reexec(sys.argv[1:])          # on AMD: once, with MKL's vendor test answered (mkl_dispatch.py)
    sys.exit(main())
