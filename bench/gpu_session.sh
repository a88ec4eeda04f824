#!/usr/bin/env bash
# Every GPU figure issue #10 asks for, in steps that each fit one 10-minute device call.
#
#   bash bench/gpu_session.sh STEP [STEP ...]      STEP: tests | layer | loss | step | step64 | all
#
# tests   pytest -m gpu tests (the CUDA tier: resume/branch bit-exactness, fp32 router and
#         buffers under bf16, a two-trial Ray sweep on one GPU)                   ~5 min
# layer   bench/moe_layer.py --device cuda: ours vs dense-active vs DeepSpeed-MoE, TFLOP/s ~3 min
# loss    bench/lm_loss.py: LM head + loss, plain vs chunked (time, peak memory)        ~1 min
# step    bench/train_step.py eager, --compile, --compile --chunked-loss: MFU of 0.1B dense
#         and E8 top-2                                                                   ~8 min
# step64  bench/train_step.py at micro-batch 64 (the "E8 top-2 fits 64" target): --compile
#         --chunked-loss, then with --activation-checkpointing as well                   ~6 min
#
# On a device machine without the project's packages, build the archive here first
# (bash ../shared/gpu/pack.sh) and carry .gpu; this script unpacks it when it is there. Logs and
# each bench's JSON line go to $OUT (the device tool's output folder) or ./gpu_out, one
# <step>.log each plus results.jsonl; a step that runs past its timeout still leaves its log.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
if [[ -f .gpu/pyext.tar.xz ]] && ! python3 -c "import ray, deepspeed" 2>/dev/null; then
  S=$(mktemp -d) && tar -xJf .gpu/pyext.tar.xz -C "$S" && export PYTHONPATH="$S:$PWD"
fi
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 WANDB_MODE=disabled
PY=${PY:-python3}

run() {  # run NAME SECONDS CMD...: log to $OUT/NAME.log, keep the last JSON line
  local name=$1 secs=$2; shift 2
  echo "== $name: $*" | tee -a "$OUT/session.log"
  local t0=$SECONDS
  timeout "$secs" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/session.log"
  grep '^{' "$OUT/$name.log" | tail -1 | sed "s/^{/{\"step\": \"$name\", /" >> "$OUT/results.jsonl"
  return 0
}

step() {
  case $1 in
    tests)  run tests 420 "$PY" -m pytest -q -m gpu tests -p no:cacheprovider ;;
    layer)  run layer 300 "$PY" bench/moe_layer.py --device cuda ;;
    loss)   run loss 120 "$PY" bench/lm_loss.py --device cuda ;;
    step)   run step_eager 150 "$PY" bench/train_step.py
            run step_compile 180 "$PY" bench/train_step.py --compile
            run step_compile_chunked 180 "$PY" bench/train_step.py --compile --chunked-loss ;;
    step64) run step64 180 "$PY" bench/train_step.py --compile --chunked-loss \
              --batch 64 --micro 64
            run step64_ckpt 180 "$PY" bench/train_step.py --compile --chunked-loss \
              --activation-checkpointing --batch 64 --micro 64 ;;
    all)    step tests; step layer; step loss; step step; step step64 ;;
    *)      echo "unknown step $1" >&2; return 2 ;;
  esac
}

[[ $# -gt 0 ]] || { sed -n 2,18p "$0"; exit 2; }
for s in "$@"; do
  [[ $s =~ ^(tests|layer|loss|step|step64|all)$ ]] ||
    { echo "unknown step $s (tests | layer | loss | step | step64 | all)" >&2; exit 2; }
done
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
  --format=csv,noheader | tee -a "$OUT/session.log"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" \
  | tee -a "$OUT/session.log"
for s in "$@"; do step "$s" || exit 2; done
