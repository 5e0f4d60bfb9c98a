#!/usr/bin/env bash
# Chapter 03 through the `deepspeed` launcher (the SeqGPT guide's way), on CPU or GPU.
#
#   scripts/03_deepspeed_launcher.sh 2 --zero-stage 3 --max-steps 10     # N processes, then script flags
#
# Why a wrapper and not just `deepspeed scripts/03_zero3.py`:
# - without GPUs the launcher counts zero devices and starts ONE process unless
#   it is given --num_gpus N (shared CPU notes, trap 4);
# - the launcher process itself imports DeepSpeed, so DS_ACCELERATOR=cpu must be
#   in its environment before it starts (ecomkit's ZeRO strategy sets it in the
#   workers, too late for the launcher);
# - TORCH_EXTENSIONS_DIR keeps the JIT-built ops (CPU Adam, shm comm) between runs.
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
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/ecomkit/torch_extensions}"
PORT="${MASTER_PORT:-$((29500 + RANDOM % 1000))}"
exec deepspeed --num_gpus "$NPROC" --master_port "$PORT" "$ROOT/scripts/03_zero3.py" "$@"
