#!/usr/bin/env bash
# The GPU figures of the project in one lease of the device (15 min in all, calls of ≤ 10 min,
# 64 MiB carried, 8 files back): two calls planned at 12 min with start-up, most valuable first.
#
#   bash bench/gpu_session.sh [--rehearse] [--out DIR] CALL|STEP [CALL|STEP ...]
#   bash bench/gpu_session.sh --plan            the budget of the two calls; exit 2 if over 12 min
#
#   call1  check tier mfu_dense mfu_moe   a 30-second import-and-one-step check (names the
#                                         failing package); the GPU test tier on CUDA; MFU of
#                                         0.1B dense and E8 top-2, seq 1024, per optim.bf16_mode
#   call2  layer sweep experts            MoE layer vs dense-active vs DeepSpeed-MoE; a 2-trial
#                                         sweep through Ray at resources.gpus 0.5; Liger vs grouped
#
# The device lacks DeepSpeed, Ray and Liger: build the pack once here (bash bench/gpu_pack.sh:
# .gpu/pyext.tar.xz, ignored, ≤ 60 MiB) and carry it (`carry: [".gpu"]`). Each call unpacks it
# and puts it on the path only for a python of the pack's own version (CPython 3.12): on any
# other (this 3.11 machine) its compiled pydantic_core and Ray would shadow the venv's. Without
# DeepSpeed or Ray the session refuses in one line (exit 2) before any step.
#
# Logs go to a scratch folder; DIR (--out, else $OUT, else ./gpu_out) gets at most three files
# per call: summary-<calls>.json (every step's exit, seconds, figures, and the raw rows the merge
# needs), logs-<calls>.tar.gz (every log and step JSON) and, after `experts`, kernel_choice.json.
# Merge a session's figures: python bench/merge_session.py DIR/summary-*.json (docs/gpu.md).
#
# --rehearse runs the same steps at a tiny size on the CPU (CUDA hidden); tests/bench/
# test_gpu_session.py runs it in CI, with a pack present.
set -uo pipefail
cd "$(dirname "$0")/.."
declare -A GPU_S=([check]=40 [tier]=120 [mfu_dense]=50 [mfu_moe]=70
                  [layer]=60 [sweep]=110 [experts]=70)   # each step's timeout on the device
declare -A CPU_S=([check]=150 [tier]=300 [mfu_dense]=240 [mfu_moe]=240
                  [layer]=180 [sweep]=600 [experts]=480)  # and in a rehearsal (a loaded CPU)
CALL1=(check tier mfu_dense mfu_moe)
CALL2=(layer sweep experts)
START_S=90      # a cold device start, counted for both calls (a warm second call saves it)
UNPACK_S=10     # unpacking the pack and the transfers, per call
LEASE_S=720     # the plan's bound: 12 of the lease's 15 minutes
REHEARSE=0
ARGS=()
plan() {
  local c1=0 c2=0 s
  for s in "${CALL1[@]}"; do c1=$((c1 + GPU_S[$s])); done
  for s in "${CALL2[@]}"; do c2=$((c2 + GPU_S[$s])); done
  local total=$((2 * START_S + 2 * UNPACK_S + c1 + c2))
  echo "{\"call1_s\": $c1, \"call2_s\": $c2, \"start_s\": $START_S, \"unpack_s\": $UNPACK_S," \
       "\"planned_s\": $total, \"lease_bound_s\": $LEASE_S," \
       "\"run_timeout_s\": {\"call1\": $((c1 + 2 * UNPACK_S)), \"call2\": $((c2 + 2 * UNPACK_S))}}"
  (( total <= LEASE_S && c1 + 2 * UNPACK_S <= 600 && c2 + 2 * UNPACK_S <= 600 ))
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --rehearse) REHEARSE=1 ;;
    --out) OUT=$2; shift ;;
    --plan) plan; exit $? ;;
    -h|--help) sed -n 2,29p "$0"; exit 0 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
[[ ${#ARGS[@]} -gt 0 ]] || { [[ $REHEARSE == 1 ]] && ARGS=(call1 call2); }
[[ ${#ARGS[@]} -gt 0 ]] || { sed -n 2,29p "$0"; exit 2; }
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TAG=$(IFS=-; echo "${ARGS[*]}")
W=$(mktemp -d)   # every log: archived into $OUT at the end
PY=${PY:-python3}
if ! "$PY" -c "import torch" 2>/dev/null && [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; fi
log() { echo "== $*" | tee -a "$W/session.log"; }
log "session $(date -u +%FT%TZ) rehearse=$REHEARSE out=$OUT: ${ARGS[*]}"

PACK=${GPU_PACK:-.gpu/pyext.tar.xz}
if [[ -f $PACK ]]; then  # unpack; on the path only for the pack's own Python
  S=$(mktemp -d)
  if tar -xJf "$PACK" -C "$S"; then
    ptag=$(cd "$S" && ls pydantic_core/_pydantic_core.*.so 2>/dev/null | head -1 \
           | sed -n 's/.*\.\(cpython-[0-9]*\)-.*/\1/p')
    mytag=$("$PY" -c "import sys; print(sys.implementation.cache_tag)")
    if [[ -n $ptag && $ptag == "$mytag" ]]; then
      export PYTHONPATH="$S${PYTHONPATH:+:$PYTHONPATH}"
      log "pack $PACK ($(( $(stat -c %s "$PACK") >> 20 )) MiB, $ptag): unpacked, on the path"
    else
      log "pack $PACK (${ptag:-no pydantic_core}): unpacked, not on the path ($PY is $mytag)"
    fi
  else
    log "pack $PACK: could not be unpacked"
  fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/inductor_cache}
missing=$("$PY" -c "
import importlib
for m in ('deepspeed', 'ray'):
    try: importlib.import_module(m)
    except Exception as e: print('MISSING', m, '(' + type(e).__name__ + ')')
" 2>/dev/null | sed -n 's/^MISSING //p' | tr '\n' ' ')
if [[ -n $missing ]]; then
  echo "gpu_session: refused: ${missing% }missing for $PY; build the pack (bash bench/gpu_pack.sh) and carry .gpu (docs/gpu.md)" >&2
  exit 2
fi
if [[ $REHEARSE == 1 ]]; then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
r() { [[ $REHEARSE == 1 ]] && echo "$2" || echo "$1"; }  # r GPU_VALUE REHEARSAL_VALUE
secs() { [[ $REHEARSE == 1 ]] && echo "${CPU_S[$1]}" || echo "${GPU_S[$1]}"; }

run() {  # run NAME [--junit] CMD...: NAME.log, then NAME.json, in $W
  local name=$1 xml=""; shift
  if [[ $1 == --junit ]]; then xml="$W/$name.xml"; shift; set -- "$@" "--junitxml=$xml"; fi
  log "$name: $*"
  local t0=$SECONDS
  timeout "$(secs "$name")" "$@" > "$W/$name.log" 2>&1
  local rc=$?
  tail -8 "$W/$name.log"
  log "$name: exit $rc after $((SECONDS - t0)) s"
  "$PY" bench/session_json.py step "$name" "$rc" "$((SECONDS - t0))" "$W/$name.log" $xml \
    > "$W/$name.json" || log "$name: no JSON written"
  return 0
}

SMI=()
smi_start() {  # per-process GPU memory every 2 s
  command -v nvidia-smi > /dev/null || return 0
  nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv -l 2 \
    > "$W/smi_apps_$1.csv" 2>&1 &
  SMI=($!)
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,power.draw \
    --format=csv -l 2 > "$W/smi_gpu_$1.csv" 2>&1 &
  SMI+=($!)
}
smi_stop() {
  [[ ${#SMI[@]} -gt 0 ]] && { kill "${SMI[@]}" 2>/dev/null; wait "${SMI[@]}" 2>/dev/null; }
  SMI=()
  "$PY" bench/session_json.py smi "$W/smi_apps_$1.csv" "$W/smi_gpu_$1.csv" > "$W/smi_$1.json"
}

sweep_spec() {  # the 2-trial sweep: 15M at 0.5 GPU each (both at once) there, debug here
  cat > "$1" <<EOF
sweep: gpu_session
base:
  model: {preset: $(r 15M debug), chunked_loss: true}
  moe: {num_experts: 8, top_k: 2, router: {order: topk_softmax, loss_free_rate: 1.0e-3}}
  data: {source: synthetic, synthetic_vocab: $(r 512 32), synthetic_tokens: $(r 4000000 60000), seq_len: $(r 1024 32)}
  batch: {global_batch: $(r 32 8), micro_batch: $(r 32 8)}
  optim: {lr: 3.0e-3}
  schedule: {kind: wsd, warmup_steps: 2, decay_frac: 0.25}
  eval: {every_steps: $(r 25 2), batches: 2}
  tokens: $(r 3276800 2048)
  parent: {tokens: $(r 1638400 2048), lr: 8.0e-3, seed: 0}
  upcycle: {method: dense_to_moe}
search:
  upcycle.lr_policy:
    grid: [{policy: constant}, {policy: reset, peak: 3.0e-3}]
resources: {cpus: 1, gpus: $(r 0.5 auto)}
checkpoint: {every_evals: 2, every_minutes: null}
logging: {wandb: {enabled: false}}
EOF
}

TIER="tests/gpu -p no:cacheprovider -q -rfE"
TINY="--presets debug --steps 2 --seq 32 --vocab 512 --batch 4 --micro 4"
MODES="--bf16-modes deepspeed,bf16_optimizer,torch_autocast"
step() {
  case $1 in
    call1|call2) local s arr="CALL${1#call}[@]"; for s in "${!arr}"; do step "$s"; done
                 return 0 ;;
    check) run check "$PY" bench/device_check.py ;;
    tier) if [[ $REHEARSE == 1 ]]; then run tier --junit "$PY" -m pytest $TIER -m "gpu and not slow"
          else run tier --junit "$PY" -m pytest $TIER -m gpu --durations=10; fi ;;
    mfu_dense|mfu_moe)
      local model=${1#mfu_}
      run "$1" "$PY" bench/train_step.py --models "$model" --chunked-loss $MODES \
        $(r "--presets 0.1B --seq 1024 --batch 32 --micro 32 --steps 5" "$TINY") ;;
    layer) run layer "$PY" bench/moe_layer.py \
             $(r "--device cuda --repeats 3" "--device cpu --tokens 256 --repeats 1") ;;
    sweep)
      local res; res=$(mktemp -d)
      sweep_spec "$res/spec.yaml"
      "$PY" -m sweeps.run "$res/spec.yaml" --dry-run > "$W/sweep_plan.log" 2>&1
      smi_start sweep
      UPCYCLE_CACHE="$res/cache" run sweep "$PY" -m sweeps.run "$res/spec.yaml" --json \
        --results "$res/r"
      smi_stop sweep
      du -sh "$res"/r/*/* > "$W/sweep_disk.log" 2>&1
      rm -rf "$res" ;;
    experts) if [[ $REHEARSE == 1 ]]; then  # Liger under Triton's interpreter, tiny shape
               TRITON_INTERPRET=1 LIGER_FUSED_MOE_AUTOTUNE=0 run experts "$PY" \
                 bench/moe_experts.py --device cpu --check --shapes tiny --tokens 24 \
                 --repeats 1 --record "$W/kernel_choice.json"
             else run experts "$PY" bench/moe_experts.py --device cuda --check --repeats 3 \
                    --record "$W/kernel_choice.json"; fi
             if [[ -f $W/kernel_choice.json ]]; then cp "$W/kernel_choice.json" "$OUT/"; fi ;;
    *) echo "unknown step $1 (call1 | call2, or one of: ${CALL1[*]} ${CALL2[*]})" >&2
       return 2 ;;
  esac
}

for s in "${ARGS[@]}"; do step "$s" || exit 2; done
"$PY" bench/session_json.py summary "$W" > "$W/summary.json.tmp" \
  && mv "$W/summary.json.tmp" "$OUT/summary-$TAG.json"
tar -C "$W" -czf "$OUT/logs-$TAG.tar.gz" .
log "wrote $(ls "$OUT" | wc -l) file(s) to $OUT"
cat "$OUT/summary-$TAG.json"
