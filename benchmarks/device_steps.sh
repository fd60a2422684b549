# Shared by the H200 round scripts (source it first thing; older ones set `started` before).
# It sets the shell options and output settings every round runs under, and `started` if unset.
# step LIMIT CMD...: run CMD under a time limit, framed by "###" lines (command, exit code, seconds)
# that the committed logs are read by; left BUDGET: seconds of BUDGET not yet spent since $started;
# fp8_shapes KERNEL: the fp8 problems of the Qwen presets (7B and VL-7B share their shapes) as
# --shape arguments.
set -uo pipefail
export PYTHONUNBUFFERED=1 COLUMNS=160
started=${started:-$(date +%s)}

step() { local limit=$1; shift; echo "### $* (limit ${limit}s)"; local t=$(date +%s); timeout "$limit" "$@"; echo "### rc=$? in $(( $(date +%s) - t )) s"; }
left() { echo $(( $1 - ($(date +%s) - started) )); }

fp8_shapes() {
  python - "$1" <<'EOF'
import sys
from omnitune.presets import get_preset, preset_problems
from omnitune.registry import get_spec
kernel = sys.argv[1]
seen = []
for model in ("qwen2.5-omni-7b", "qwen2.5-omni-3b", "qwen3-omni-30b-a3b"):
    for p in preset_problems(get_preset(model), kernel):
        key = get_spec(kernel).problem_key(p.problem)
        if p.problem.cache_dtype != "auto" and key not in seen:
            seen.append(key)
print(" ".join(f"--shape {k}" for k in seen))
EOF
}
