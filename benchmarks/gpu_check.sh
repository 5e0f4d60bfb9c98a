#!/usr/bin/env bash
# One prepared GPU check for a bare GPU machine that has only torch, transformers and accelerate.
#
#   benchmarks/gpu_check.sh --wheels DIR [--budget-s 480] [--out DIR] [--target DIR] [--parts P ...] [--no-attn-rule]
#   benchmarks/gpu_check.sh --wheels DIR --dry-run --out DIR     # the same steps on a CPU, tiny (a test runs it)
#
# 1. checks the base: torch (and whether it sees a CUDA GPU), transformers, accelerate;
# 2. installs every wheel of --wheels DIR (benchmarks/gpu_wheels.sh builds that folder: datasets, deepspeed, peft,
#    liger-kernel, cut-cross-entropy and what they need beyond the base) with
#    `pip install --no-index --no-deps --target DIR` (nothing is fetched, the machine's torch is left alone), and
#    puts that folder and the repository on PYTHONPATH;
# 3. imports what the benchmarks need (the chapter scripts: datasets with dill, multiprocess and xxhash; deepspeed
#    with hjson and pydantic; peft; the fused losses need a CUDA GPU and triton, so on a CPU they are only reported);
# 4. measures within --budget-s (default 480 s: 8 minutes, everything above included): bench_attn_rule on the GPU
#    (where --attn auto switches there; about an eighth of the budget, at most 60 s), then gpu_bench with the rest;
# 5. writes their artifacts to --out (default benchmarks/results/; in a dry run runs/gpu_check_dryrun/) and the
#    whole log beside them (gpu_check.log).
#
# Exit status: 2 when the base or a required import is missing (the message names it), else gpu_bench's (1 when a
# row failed or timed out; its artifact is written either way).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
WHEELS="" TARGET="" ARTIFACTS="" BUDGET=480 DRY=0 ATTN_RULE=1 PARTS=()
START=$SECONDS

usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) WHEELS="$2"; shift 2 ;;
    --target) TARGET="$2"; shift 2 ;;
    --out) ARTIFACTS="$2"; shift 2 ;;
    --budget-s) BUDGET="$2"; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    --no-attn-rule) ATTN_RULE=0; shift ;;
    --parts) shift; while [ $# -gt 0 ] && [ "${1#--}" = "$1" ]; do PARTS+=("$1"); shift; done ;;
    -h|--help) usage 0 ;;
    *) echo "gpu_check.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
if [ -z "$WHEELS" ] || [ ! -d "$WHEELS" ] || ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
  echo "gpu_check.sh: --wheels DIR must name a folder of .whl files (got '${WHEELS}'); build one on a machine" \
       "with internet access with benchmarks/gpu_wheels.sh --out DIR" >&2
  exit 2
fi
if [ -z "$ARTIFACTS" ]; then
  if [ "$DRY" = 1 ]; then ARTIFACTS="$REPO/runs/gpu_check_dryrun"; else ARTIFACTS="$REPO/benchmarks/results"; fi
fi
mkdir -p "$ARTIFACTS"
ARTIFACTS="$(cd "$ARTIFACTS" && pwd)"
LOG="$ARTIFACTS/gpu_check.log"
exec > >(tee -a "$LOG") 2>&1
TARGET="${TARGET:-$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-site.XXXXXX")}"
mkdir -p "$TARGET"
TARGET="$(cd "$TARGET" && pwd)"
echo "== gpu_check: $(date -u +%FT%TZ), repository $REPO, wheels $WHEELS, budget ${BUDGET} s, dry run $DRY"

echo "== 1. the base: torch, transformers, accelerate"
if ! "$PY" - <<'EOF'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "accelerate") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing from the base: {', '.join(missing)}; this check expects torch, transformers and accelerate "
             "installed (pip install torch transformers accelerate, with the torch build for the machine's CUDA)")
import accelerate, torch, transformers
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}, GPU visible: {torch.cuda.is_available()}"
      + (f", {torch.cuda.device_count()} × {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "")
      + f"), transformers {transformers.__version__}, accelerate {accelerate.__version__}")
EOF
then exit 2; fi

echo "== 2. install $(ls "$WHEELS"/*.whl | wc -l) wheels into $TARGET (no index, no dependencies resolved)"
"$PY" -m pip install --quiet --no-index --no-deps --disable-pip-version-check --target "$TARGET" "$WHEELS"/*.whl
export PYTHONPATH="$REPO:$TARGET${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$TARGET/bin:$PATH"          # the wheels' commands: ninja, which DeepSpeed's and torch's JIT builds call
export ECOMKIT_CACHE="${ECOMKIT_CACHE:-$REPO/.cache/ecomkit}"

echo "== 3. imports"
if ! "$PY" - "$TARGET" "$DRY" <<'EOF'
import importlib, pathlib, sys
target, dry = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
# what the benchmarks need beyond the base, and what only a CUDA GPU with triton can import
required = ["ecomkit", "ecomlab", "datasets", "dill", "multiprocess", "xxhash", "deepspeed", "hjson", "pydantic",
            "peft"]
gpu_only = {"liger_kernel", "cut_cross_entropy"}
installed = []
for info in sorted(target.glob("*.dist-info")):   # each wheel's top-level modules, from the files it installed
    tops = {line.split(",")[0].split("/")[0] for line in (info / "RECORD").read_text().splitlines() if line}
    installed += sorted(t.removesuffix(".py") for t in tops if not t.endswith((".dist-info", ".data", ".pth"))
                        and t not in ("bin", "__pycache__", "..") and not t.startswith("_"))
failed = []
for name in dict.fromkeys(required + sorted(gpu_only) + installed):
    try:
        mod = importlib.import_module(name)
        where = pathlib.Path(getattr(mod, "__file__", "") or "?")
        origin = "wheel folder" if target in where.parents else "machine"
        print(f"  ok       {name:<22} from the {origin}: {where}")
    except Exception as exc:   # noqa: BLE001 - each failure is reported, then counted
        line = f"{name:<22} {type(exc).__name__}: {str(exc)[:160]}"
        if name in gpu_only:
            print(f"  skipped  {line} (needs a CUDA GPU and triton: gpu_bench skips its loss-kernel row)")
        else:
            print(f"  MISSING  {line}")
            failed.append(name)
if failed:
    sys.exit(f"cannot import {', '.join(failed)}: add their wheels to the folder (benchmarks/gpu_wheels.sh, with "
             "--have <pip freeze of this machine> if it has other versions)")
EOF
then exit 2; fi

left() { echo $(( BUDGET - (SECONDS - START) )); }
DRYFLAG=()
[ "$DRY" = 1 ] && DRYFLAG=(--dry-run)
if [ "$ATTN_RULE" = 1 ]; then
  RULE_S=$(( $(left) / 8 )); [ "$RULE_S" -gt 60 ] && RULE_S=60
  echo "== 4a. bench_attn_rule: eager vs sdpa by length and micro-batch (budget ${RULE_S} s)"
  timeout $(( RULE_S + 120 )) "$PY" "$REPO/benchmarks/bench_attn_rule.py" ${DRYFLAG[@]+"${DRYFLAG[@]}"} --budget-s "$RULE_S" \
    --out "$ARTIFACTS" || echo "bench_attn_rule stopped with status $? (gpu_bench runs anyway)"
fi
BENCH_S=$(( $(left) - 15 ))
if [ "$BENCH_S" -lt 60 ]; then
  echo "gpu_check.sh: only $(left) s of --budget-s $BUDGET left for gpu_bench; give a larger --budget-s" >&2
  exit 2
fi
echo "== 4b. gpu_bench (budget ${BENCH_S} s)"
PARTFLAG=()
[ ${#PARTS[@]} -gt 0 ] && PARTFLAG=(--parts "${PARTS[@]}")
status=0
timeout $(( BENCH_S + 60 )) "$PY" "$REPO/benchmarks/gpu_bench.py" ${DRYFLAG[@]+"${DRYFLAG[@]}"} ${PARTFLAG[@]+"${PARTFLAG[@]}"} \
  --budget-s "$BENCH_S" --out "$ARTIFACTS" || status=$?
echo "== done in $(( SECONDS - START )) s: artifacts and gpu_check.log in $ARTIFACTS (gpu_bench status $status)"
exit "$status"
