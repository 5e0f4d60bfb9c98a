#!/usr/bin/env bash
# Chapter 03 through the `deepspeed` launcher (the SeqGPT guide's way), on CPU or GPU, on one node or several.
#
#   scripts/03_deepspeed_launcher.sh 2 --zero-stage 3 --max-steps 10     # N processes, then script flags
#   # several nodes without ssh/pdsh: run this on every node, NODE_RANK 0..NNODES-1, MASTER_ADDR = node 0
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=node0 MASTER_PORT=29600 HOSTFILE=hosts scripts/03_deepspeed_launcher.sh 8
#
# Why a wrapper and not just `deepspeed scripts/03_zero3.py`:
# - without GPUs the launcher counts zero devices and starts ONE process unless
#   it is given --num_gpus N;
# - the launcher process itself imports DeepSpeed, so DS_ACCELERATOR=cpu must be
#   in its environment before it starts (ecomkit's ZeRO strategy sets it in the
#   workers, too late for the launcher);
# - TORCH_EXTENSIONS_DIR is left to the workers unless you set it: ecomkit keeps the JIT-built ops (CPU Adam)
#   in one folder per Python environment, so this launcher and torchrun share one build;
# - with --num_nodes > 1 the launcher refuses to run without a hostfile ("Num nodes is >1 but no extra
#   nodes available via hostfile"), even with --no_ssh, where it reads the file only to number the nodes
#   and their slots. HOSTFILE is yours (one "host slots=N" line per node, the same file on every node);
#   without it a file naming node0..node{NNODES-1} with N slots each is written, which is all --no_ssh
#   needs. The command it runs on each node is
#     deepspeed --hostfile H --no_ssh --num_nodes NNODES --node_rank NODE_RANK \
#         --master_addr MASTER_ADDR --master_port MASTER_PORT --num_gpus N scripts/03_zero3.py ...
# The launcher appends --local_rank=N to the script's arguments; 03_zero3.py accepts
# and ignores it (LOCAL_RANK from the environment is what ecomkit reads).
set -euo pipefail
NPROC="${1:-2}"
shift || true
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  export DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}"
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PORT="${MASTER_PORT:-$((29500 + RANDOM % 1000))}"
NNODES="${NNODES:-1}"
if [ "$NNODES" -le 1 ]; then
  exec deepspeed --num_gpus "$NPROC" --master_port "$PORT" "$ROOT/scripts/03_zero3.py" "$@"
fi
: "${NODE_RANK:?set NODE_RANK (0..NNODES-1) on every node}"
: "${MASTER_ADDR:?set MASTER_ADDR to node 0s address, the same on every node}"
: "${MASTER_PORT:?set MASTER_PORT to one free port, the same on every node}"
if [ -z "${HOSTFILE:-}" ]; then
  HOSTFILE="$(mktemp "${TMPDIR:-/tmp}/ds_hostfile.XXXXXX")"
  for ((i = 0; i < NNODES; i++)); do echo "node$i slots=$NPROC"; done > "$HOSTFILE"
fi
exec deepspeed --hostfile "$HOSTFILE" --no_ssh --num_nodes "$NNODES" --node_rank "$NODE_RANK" \
  --master_addr "$MASTER_ADDR" --master_port "$PORT" --num_gpus "$NPROC" "$ROOT/scripts/03_zero3.py" "$@"
