#!/usr/bin/env bash
# Build the wheel folder benchmarks/gpu_check.sh installs on a GPU machine that has only torch, transformers and
# accelerate (and no internet): datasets, deepspeed, peft, liger-kernel, cut-cross-entropy and every dependency of
# theirs that torch + transformers + accelerate do not already bring. Run it where PyPI is reachable.
#
#   benchmarks/gpu_wheels.sh [--out DIR] [--have FREEZE.txt] [--pin SPEC ...] [--python-version X.Y]
#
# --out DIR             the folder (default .gpu_wheels/, ignored by git)
# --have FREEZE.txt     `pip freeze` of the GPU machine: what it already has is left out (default: what pip resolves
#                       for torch, transformers and accelerate, the base the check assumes)
# --pin SPEC            a version to use instead of this environment's, e.g. --pin datasets==4.4.1 (repeatable)
# --python-version X.Y  the GPU machine's Python, when it is not this one's (wheels for manylinux x86_64)
#
# Versions: those installed in this environment (what the test suite runs) for datasets, deepspeed and peft, and the
# versions whose source ecomkit's fused-loss glue was written against for liger-kernel and cut-cross-entropy.
# deepspeed is published as a source archive only: it is built here into a pure-Python wheel (its C++ ops are
# compiled just in time on the GPU machine, with the ninja the folder carries). torch, triton and bitsandbytes are
# never in the folder. The last lines give the folder's size and its largest wheels.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
OUT="$REPO/.gpu_wheels" HAVE="" PYVER="" PINS=()
LIGER="liger-kernel==0.8.5" CCE="cut-cross-entropy==25.1.1"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$2"; shift 2 ;;
    --have) HAVE="$2"; shift 2 ;;
    --pin) PINS+=("$2"); shift 2 ;;
    --python-version) PYVER="$2"; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_wheels.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
PLATFORM=(--only-binary=:all:)
[ -n "$PYVER" ] && PLATFORM+=(--python-version "$PYVER" --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64)

# The specs: this environment's versions, then --pin overrides by name.
read -r -a SPECS <<< "$("$PY" - "$LIGER" "$CCE" ${PINS[@]+"${PINS[@]}"} <<'EOF'
import importlib.metadata as md, re, sys
specs = {}
for name in ("datasets", "deepspeed", "peft"):
    try:
        specs[name] = f"{name}=={md.version(name)}"
    except md.PackageNotFoundError:
        specs[name] = name
for spec in sys.argv[1:]:
    specs[re.split(r"[<>=!~ ]", spec, maxsplit=1)[0].lower()] = spec
print(" ".join(specs.values()))
EOF
)"
echo "== specs: ${SPECS[*]}"
DS_SPEC="" OTHER=()
for s in "${SPECS[@]}"; do
  if [ "${s%%[<>=!~]*}" = deepspeed ]; then DS_SPEC="$s"; else OTHER+=("$s"); fi
done

echo "== deepspeed: $DS_SPEC into a wheel (a source archive on PyPI)"
rm -f "$OUT"/deepspeed-*.whl
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation "$DS_SPEC" -w "$OUT"
DS_WHEEL="$(ls "$OUT"/deepspeed-*.whl | head -1)"

echo "== resolving what the base brings and what the benchmarks need (metadata only)"
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$TMP/base.json" --target "$TMP/t" \
  "${PLATFORM[@]}" torch transformers accelerate
"$PY" -m pip install --quiet --dry-run --ignore-installed --report "$TMP/need.json" --target "$TMP/t" \
  "${PLATFORM[@]}" "${OTHER[@]}" "$DS_WHEEL" torch transformers accelerate

"$PY" - "$TMP" "$HAVE" > "$TMP/list.txt" <<'EOF'
import json, pathlib, re, sys
tmp, have = pathlib.Path(sys.argv[1]), sys.argv[2]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
if have:    # the GPU machine's own list: leave out whatever it has, at any version
    base = {norm(re.split(r"[=<>@ ]", l.strip(), maxsplit=1)[0]) for l in open(have) if l.strip() and not l.startswith("#")}
else:
    base = {norm(i["metadata"]["name"]) for i in json.load(open(tmp / "base.json"))["install"]}
never = {"torch", "triton", "bitsandbytes", "deepspeed"}   # deepspeed: built above
for item in json.load(open(tmp / "need.json"))["install"]:
    name = norm(item["metadata"]["name"])
    if name not in base and name not in never and not name.startswith("nvidia-"):
        print(f"{item['metadata']['name']}=={item['metadata']['version']}")
EOF
mapfile -t WANT < "$TMP/list.txt"
echo "== downloading ${#WANT[@]} wheels: ${WANT[*]}"
"$PY" -m pip download --quiet --no-deps "${PLATFORM[@]}" -d "$OUT" "${WANT[@]}"

echo "== $OUT: $(ls "$OUT"/*.whl | wc -l) wheels, $(du -sm "$OUT" | cut -f1) MiB; the largest:"
ls -S "$OUT"/*.whl | head -4 | while read -r f; do echo "   $(du -m "$f" | cut -f1) MiB  $(basename "$f")"; done
echo "install on the GPU machine with: benchmarks/gpu_check.sh --wheels $(basename "$OUT")"
