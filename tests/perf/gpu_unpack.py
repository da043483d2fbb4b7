"""Rebuild a GPU session's training run here from what came back (gpu_session.sh's $OUT): the last checkpoint's
weights (bf16, xz, in parts: widened back to fp32, which `training export` rounds to the same bf16 again) and its
state.json, so that `training export --run RUN` and `training eval` work as for a run trained here. The optimizer
state stays behind (too big to come back): a resume here starts from a new run with `--init`.

    python tests/perf/gpu_unpack.py FILES_AT RUN
"""
from __future__ import annotations

import json
import lzma
import sys
import tarfile
from pathlib import Path

from safetensors.torch import load, save_file


def main(src: str, run: str) -> None:
    src_dir, run_dir = Path(src), Path(run)
    parts = sorted(src_dir.glob("model.bf16.xz.*"), key=lambda p: int(p.suffix[1:]))
    if not parts:
        raise SystemExit(f"{src_dir}: no model.bf16.xz.* parts")
    sd = load(lzma.decompress(b"".join(p.read_bytes() for p in parts)))
    state = json.loads((src_dir / "state.json").read_text())
    name = f"step-{state['step']:07d}"
    ck = run_dir / "checkpoints" / name
    ck.mkdir(parents=True, exist_ok=True)
    save_file({k: (v.float() if v.is_floating_point() else v) for k, v in sd.items()}, str(ck / "model.safetensors"),
              metadata={"format": "pt"})
    (ck / "state.json").write_text(json.dumps(state, indent=2))
    (run_dir / "LATEST").write_text(name)
    logs = src_dir / "logs.tar.gz"
    if logs.is_file():
        with tarfile.open(logs) as t:
            t.extractall(run_dir / "gpu-logs", filter="data")
        for kept in ("metrics.jsonl", "tokenizer.json"):         # the run's own copies
            if (run_dir / "gpu-logs" / kept).is_file():
                (run_dir / kept).write_bytes((run_dir / "gpu-logs" / kept).read_bytes())
    print(f"{run_dir}: {name} ({len(sd)} tensors), step {state['step']}/{state['total_steps']}, "
          f"{state['tokens_seen']:,} tokens, val loss {state['val_loss']}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], sys.argv[2])
