#!/usr/bin/env bash
# Teacher data generation on a lent GPU, in the device tool's calls (each sends at most 64 MiB, the teacher's GGUF
# is 98 MB, and the machine keeps what a call left in /tmp while it stays warm, 30 s between calls):
#
#   bash tests/perf/gpu_generate.sh part DIR                  # keep the carried parts in DIR (one call per part)
#   bash tests/perf/gpu_generate.sh run SECONDS OUT [generate flags...]
#        # join the parts (sha256 checked against DIR's SHA256), install the carried gguf wheel, generate for
#        # SECONDS into OUT (SIGTERM then: the finished conversations are flushed as a short shard), and pack OUT's
#        # shards as $OUT/shards.tar (at most 16 MiB a file comes back)
#
# Here, before the calls: split the GGUF into parts under two ignored folders that each call carries, e.g.
#   split -b 48M -d "$(python -c 'from tinychat.training.teacher import find_teacher_gguf as f; print(f())')" part-
#   sha256sum of the whole file into SHA256 beside them; the gguf wheel (pip download --no-deps gguf) in .whl.
# DEVICE=cpu runs the same steps on the CPU (a dry run).
set -u
keep=/tmp/teacher-parts
mkdir -p "$keep"
case "${1:-}" in
  part)
    src=${2:?folder of parts}
    cp "$src"/part-* "$keep"/ && { [ ! -f "$src/SHA256" ] || cp "$src/SHA256" "$keep/"; }
    ls -la "$keep"
    ;;
  run)
    secs=${2:?seconds}; out_dir=${3:?output folder}; shift 3
    out=${OUT:-/tmp/gpu-generate-out}; mkdir -p "$out"
    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
    py=${PYTHON:-python3}
    gguf=/tmp/teacher.gguf
    cat "$keep"/part-* > "$gguf" || exit 1
    if [ -f "$keep/SHA256" ]; then
      echo "$(cat "$keep/SHA256")  $gguf" | sha256sum -c - || exit 1
    fi
    if ! $py -c "import gguf" 2>/dev/null; then
      $py -m pip install -q --no-index --no-deps --target /tmp/site .whl/gguf-*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
    fi
    timeout -s TERM "$secs" $py -m tinychat.training generate --device "${DEVICE:-cuda}" --workers 1 \
      --teacher "$gguf" --out "$out_dir" "$@" 2>&1 | tee "$out/generate.log" | grep -v "^\s*$" | tail -20
    tar -cf "$out/shards.tar" -C "$(dirname "$out_dir")" "$(basename "$out_dir")"
    ls -la "$out"
    ;;
  *)
    echo "usage: $0 part DIR | run SECONDS OUT [generate flags...]" >&2
    exit 2
    ;;
esac
