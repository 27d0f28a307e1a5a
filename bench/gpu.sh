#!/usr/bin/env bash
# The GPU benchmarks in one go (about 8 minutes on one H200-class GPU); every part writes a Markdown
# table (and its stderr) into the results folder, with a time limit of its own, so a slow or failing
# part costs only its slot and the others still report.
#
#   bench/gpu.sh [OUT_DIR]              # CUDA machine; default OUT_DIR: bench/gpu-results (git-ignored)
#   bench/gpu.sh --dry-run [OUT_DIR]    # the same steps on the CPU at toy sizes (checks the script)
#
# Parts: (1) fused shaped attention vs SDPA, bf16, up to 16k tokens (bench/attention.py);
# (2) training throughput vs the reference GPT (bench/throughput.py); (3) 192- and 1000-layer DSLM
# steps, eager vs train.compile="blocks" vs activation checkpointing, time and peak memory
# (bench/depth.py); (4) `sigprop train` with train.distributed="fsdp", bf16, on every visible GPU
# (torchrun; with one GPU this is the single-process path).
# Environment: PYTHON (default python3) must import torch with CUDA and sigprop's train extra.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
OUT=${1:-bench/gpu-results}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.md"
: > "$SUMMARY"

# part NAME SECONDS CMD...: run CMD with a time limit; stdout -> OUT/NAME.md, stderr -> OUT/NAME.err
part() {
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "## $name" >> "$SUMMARY"
  echo '    '"$*" >> "$SUMMARY"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.md" 2> "$OUT/$name.err"
  local rc=$?
  local status="ok"
  [[ $rc == 124 || $rc == 137 ]] && status="TIMED OUT after ${limit} s (partial table kept)"
  [[ $rc != 0 && $status == ok ]] && status="FAILED (exit $rc): $(tail -n 1 "$OUT/$name.err")"
  echo "" >> "$SUMMARY"
  echo "$status, $((SECONDS - t0)) s" >> "$SUMMARY"
  echo "" >> "$SUMMARY"
  cat "$OUT/$name.md" >> "$SUMMARY"
  echo "" >> "$SUMMARY"
  echo "[$name] $status ($((SECONDS - t0)) s)"
}

{
  date -u
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  git log -1 --format='commit %H %cs' 2>/dev/null
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [[ $DRY == 1 ]]; then
  DEV=cpu; NGPU=2
  ATTN=(--seqs 64 --repeats 1 --dtype bfloat16)
  THRU=(--d-model 32 --n-layers 2 --seq 32 --batch 4 --vocab 512 --rounds 1)
  DEPTH=(--shapes 2x32 --modes eager blocks checkpoint --batch 2 --seq 16 --repeats 1 --precision bf16)
  FSDP_SETS=(model.d_model=32 model.n_layers=2 data.seq_len=32 data.max_chars=100000 train.batch_size=8
             train.steps=4 train.device=cpu)
  LIMITS=(300 300 600 300)
else
  DEV=cuda; NGPU=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  ATTN=(--seqs 1024 4096 16384 --repeats 5 --dtype bfloat16 --skip-explicit-above 4096)
  THRU=(--d-model 1024 --n-layers 12 --n-heads 16 --seq 1024 --batch 16 --vocab 8192 --rounds 3 --steps 2)
  # 1000 layers at 16 × 1024 tokens may not fit without checkpointing: an out-of-memory row is a result
  DEPTH=(--shapes 192x256 1000x256 --modes eager blocks checkpoint --batch 16 --seq 1024 --vocab 32768
         --repeats 2 --precision bf16 --timeout 100)
  FSDP_SETS=(model.d_model=512 model.n_layers=48 model.n_heads=8 model.max_seq_len=512 data.seq_len=512
             data.max_chars=4000000 train.batch_size=64 train.steps=40 train.device=cuda)
  LIMITS=(70 80 250 70)        # 470 s of parts, about 8 min with start-up
fi

part attention "${LIMITS[0]}" "$PY" bench/attention.py --device "$DEV" "${ATTN[@]}"
part throughput "${LIMITS[1]}" "$PY" bench/throughput.py --device "$DEV" "${THRU[@]}"
part depth "${LIMITS[2]}" "$PY" bench/depth.py cases --device "$DEV" "${DEPTH[@]}" --json "$OUT/depth.json"

# FSDP: a short Pre-LN DSLM run on every GPU (torchrun); the table: step time and tokens/s from metrics.jsonl
fsdp_run() {
  local run="$OUT/fsdp-run" args=(--config configs/tiny_decoder.toml)
  local s
  for s in model.scheme=dslm model.norm_placement=pre train.distributed=fsdp train.precision=bf16 train.eval_batches=0 \
           train.diag_every=0 train.progress=false train.ckpt_every=0 "train.out_dir=$run" "${FSDP_SETS[@]}"; do
    args+=(--set "$s")
  done
  rm -rf "$run"
  "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" -m sigprop train "${args[@]}" >&2 || return $?
  "$PY" - "$run" "$NGPU" <<'PYEOF'
import json, statistics, sys
from pathlib import Path
run, ngpu = Path(sys.argv[1]), sys.argv[2]
rows = [json.loads(line) for line in open(run / "metrics.jsonl")]
train = [r for r in rows if r.get("kind") == "train"]
cfg = (run / "config.toml").read_text()
get = lambda key: next(line.split("=")[1].strip() for line in cfg.splitlines() if line.startswith(key + " ="))
tokens = int(get("batch_size")) * int(get("seq_len"))
dt = statistics.median(r["dt"] for r in train[len(train) // 2:])          # second half: warmed up
print(f"ranks {ngpu}, {len(train)} steps, global batch {get('batch_size')} x {get('seq_len')} tokens, "
      f"d_model {get('d_model')}, {get('n_layers')} layers")
print("| step | loss | dt s |\n|---:|---:|---:|")
for r in train:
    print(f"| {r['step']} | {r['loss']:.4f} | {r['dt']:.3f} |")
print(f"\nmedian step (second half) {dt:.3f} s, {tokens / dt:,.0f} tokens/s")
PYEOF
}
export -f fsdp_run
export OUT PY NGPU
export FSDP_SETS_STR="${FSDP_SETS[*]}"
part fsdp "${LIMITS[3]}" bash -c 'FSDP_SETS=($FSDP_SETS_STR); fsdp_run'

echo "results: $OUT (summary.md)"
