#!/usr/bin/env bash
# A lent GPU's session in one command, most value per minute first: the CUDA tests, the Decoder's four modes
# (gpu_modes.py), then a training stage on the GPU whose weights come back through the device tool's $OUT
# (at most 8 files of 16 MiB: bf16, xz-compressed, in 15 MiB parts) with the run's state, metrics and logs.
#
#   bash tests/perf/gpu_session.sh BUDGET_S RUN [train flags...]      # e.g. 540 runs/v11 --shards ... --init assets
#
# The working tree that travels is capped at 64 MiB, so assets/model.safetensors may travel as
# assets/model.safetensors.xz (unpacked here first). Back on the CPU machine: tests/perf/gpu_unpack.py OUT RUN
# rebuilds RUN's last checkpoint (weights and state.json) for `training export` and `training eval`.
# DEVICE=cpu runs the same steps on the CPU (a dry run of the script; the CUDA steps skip).
set -u
start=$(date +%s)
budget=${1:?budget in seconds}; run=${2:?run folder}; shift 2
device=${DEVICE:-cuda}
out=${OUT:-/tmp/gpu-session-out}
logs=$(mktemp -d); mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}
left() { echo $(( budget - ($(date +%s) - start) )); }
stamp() { echo "== $(date -u +%H:%M:%S) +$(( $(date +%s) - start ))s: $*" | tee -a "$logs/timeline.txt"; }

stamp "machine"
{ nvidia-smi || true; lscpu | grep -E "Model name|^CPU\(s\)" || true
  $py -c "import torch; print('torch', torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
} > "$logs/machine.txt" 2>&1
cat "$logs/machine.txt"
if [ -f assets/model.safetensors.xz ] && [ ! -f assets/model.safetensors ]; then
  stamp "unpack assets/model.safetensors.xz"
  $py -c "import lzma, shutil; shutil.copyfileobj(lzma.open('assets/model.safetensors.xz'), open('assets/model.safetensors', 'wb'))"
fi

if [ "$device" = cuda ] && [ -z "${SKIP_CHECKS:-}" ]; then
  stamp "CUDA tests"
  timeout 120 $py -m pytest -q -m cuda -p no:cacheprovider tests/unit/test_decoder.py tests/unit/test_llama_engine.py \
    tests/unit/test_training_device.py > "$logs/cuda_tests.txt" 2>&1; echo "rc=$?" >> "$logs/cuda_tests.txt"
  tail -5 "$logs/cuda_tests.txt"
  stamp "gpu_modes"
  for q in none bf16; do
    timeout 90 $py tests/perf/gpu_modes.py --config full --quant $q --repeats 3 >> "$logs/gpu_modes.txt" 2>&1
    echo "rc=$? (quant $q)" >> "$logs/gpu_modes.txt"
  done
  grep -E "^\||rc=|error" "$logs/gpu_modes.txt"
fi

train_s=$(( $(left) - 60 ))          # the rest, less the packing (~30 s) and a margin
stamp "train for ${train_s}s"
timeout $(( train_s + 30 )) $py -m tinychat.training train --device "$device" --run "$run" --finish-within "${train_s}s" \
  "$@" > "$logs/train.txt" 2>&1; echo "rc=$?" >> "$logs/train.txt"
grep -vE "^\[" "$logs/train.txt" | tail -8; grep -E "^\[" "$logs/train.txt" | tail -3

stamp "pack"
$py - "$run" "$out" <<'EOF'
import json, lzma, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save
run, out = Path(sys.argv[1]), Path(sys.argv[2])
ck = run / "checkpoints" / (run / "LATEST").read_text().strip()
sd = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in load_file(str(ck / "model.safetensors")).items()}
blob = lzma.compress(save(sd, metadata={"format": "pt"}), preset=1)
part = 15 * 2**20
for i in range(0, len(blob), part):
    (out / f"model.bf16.xz.{i // part}").write_bytes(blob[i:i + part])
(out / "state.json").write_bytes((ck / "state.json").read_bytes())
print(f"packed {ck.name}: {len(blob) / 2**20:.1f} MiB in {(len(blob) + part - 1) // part} parts")
EOF
cp "$run/metrics.jsonl" "$run/tokenizer.json" "$logs/" 2>/dev/null
stamp "done"
tar -czf "$out/logs.tar.gz" -C "$logs" .
ls -la "$out"
