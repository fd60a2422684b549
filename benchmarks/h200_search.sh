#!/usr/bin/env bash
# Tune the attention shapes of benchmarks/attention_shapes.py on the H200: 60 TPE trials each,
# one results database for all of them. Resumable: run it again and finished trials are kept.
#   bash benchmarks/h200_search.sh DB_PATH [PER_SHAPE_TIMEOUT_S] [SHAPE_NAME ...]
set -uo pipefail
db=${1:?results database path}
per_shape=${2:-70}
shift 2 || true
names=("$@")
[[ ${#names[@]} -gt 0 ]] || names=($(python -c "import sys; sys.path.insert(0, 'benchmarks'); from attention_shapes import SHAPES; print(*SHAPES)"))
for name in "${names[@]}"; do
  shape=$(python -c "import sys; sys.path.insert(0, 'benchmarks'); from attention_shapes import SHAPES; print(SHAPES['$name'])")
  echo "=== $name: $shape"
  start=$(date +%s)
  python -m omnitune search attention --shape "$shape" --dtype bf16 --trials 60 --sampler tpe --seed 0 \
    --timeout "$per_shape" --db "$db"
  echo "=== $name: $(( $(date +%s) - start )) s wall"
done
