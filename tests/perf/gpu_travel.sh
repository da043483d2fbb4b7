#!/usr/bin/env bash
# The working tree a device call sends is capped at 64 MiB (tracked and untracked-not-ignored files); this checkout
# is ~84 MB (the shipped model 43.5 MB, the shards ~37 MB). Make a throwaway branch that fits, checked out while the
# calls run, then come back:
#
#   bash tests/perf/gpu_travel.sh train       # data/shards-3 .. -9 kept, the model as assets/model.safetensors.xz
#   bash tests/perf/gpu_travel.sh generate    # no model, no shards: the code and data/plans-*.jsonl.gz
#   bash tests/perf/gpu_travel.sh back        # main again (the branch deleted)
#
# gpu_session.sh unpacks the .xz model on the device. Uncommitted changes must be committed or stashed first.
set -eu
branch=device-travel
case "${1:-}" in
  train|generate)
    if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
      echo "commit or stash the changes first" >&2; exit 1
    fi
    git checkout -q -B "$branch"
    git rm -rq --ignore-unmatch data/shards data/shards-1 data/shards-2
    if [ "$1" = generate ]; then
      git rm -rq --ignore-unmatch data/shards-3 data/shards-4 data/shards-5 data/shards-6 data/shards-7 data/shards-8 \
        data/shards-9 docs
    fi
    python3 -c "import lzma, subprocess; open('assets/model.safetensors.xz', 'wb').write(lzma.compress(
        subprocess.check_output(['git', 'show', 'HEAD:assets/model.safetensors']), preset=1))"
    git rm -q assets/model.safetensors
    if [ "$1" = generate ]; then rm assets/model.safetensors.xz; else git add assets/model.safetensors.xz; fi
    git commit -qm "device travel ($1): what one call sends"
    git ls-files -z | du -cb --files0-from=- | tail -1
    ;;
  back)
    git checkout -q main
    git branch -D "$branch"
    ;;
  *)
    echo "usage: $0 train | generate | back" >&2; exit 2;;
esac
