#!/usr/bin/env bash
# Every GPU figure of the GPU issue (#27) in one short visit: three device calls of at most
# 9 minutes each (each call's step timeouts sum to 540 s; ~20 min of device time in all), and a
# short fourth (4 min at most) for the expert kernels.
#
#   bash bench/gpu_session.sh [--rehearse] [--out DIR] CALL|STEP [CALL|STEP ...]
#
#   call1  env tier tier_sweep layer      environment; the GPU tier (its Ray sweep apart, with
#                                         per-process GPU memory); the MoE layer bench
#   call2  head mfu_dense mfu_moe step64  head bench; MFU of 0.1B dense (micro 128) and E8 top-2
#                                         (micro 32), compiled with the chunked loss; E8 at 64
#   call3  core sweep compile profile     all of tests/moe_core on CUDA; a 2-trial sweep through
#                                         Ray with per-process GPU memory; compile diagnostics;
#                                         a kernel-time profile (torch.profiler)
#   call4  experts                        Liger fused MoE vs grouped experts per fine shape
#                                         (bench/moe_experts.py --check): DIR/kernel_choice.json,
#                                         to merge into the committed table afterwards with
#                                         python bench/moe_experts.py --merge DIR/kernel_choice.json
#   spare  step64_ckpt mfu_dense64        only if step64 ran out of memory / time is left
#
# Each step writes DIR/<step>.log and DIR/<step>.json (exit code, seconds, and the bench's JSON
# line or the pytest counts); sampled steps add DIR/smi_<step>.json (peak GPU memory per
# process). DIR/summary.json is rebuilt after every call. DIR: --out, else $OUT (the device
# tool's output folder), else ./gpu_out. A step killed by its timeout still leaves its log.
#
# --rehearse runs every step at a tiny size on the CPU (CUDA hidden) in a few minutes, so a
# broken script is caught before a GPU is spent on it: `bash bench/gpu_session.sh --rehearse`
# (all four calls; tests/bench/test_gpu_session.py runs it in CI).
set -uo pipefail
cd "$(dirname "$0")/.."
REHEARSE=0
ARGS=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --rehearse) REHEARSE=1 ;;
    --out) OUT=$2; shift ;;
    -h|--help) sed -n 2,29p "$0"; exit 0 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done
[[ ${#ARGS[@]} -gt 0 ]] || { [[ $REHEARSE == 1 ]] && ARGS=(call1 call2 call3 call4); }
[[ ${#ARGS[@]} -gt 0 ]] || { sed -n 2,29p "$0"; exit 2; }
OUT=${OUT:-$PWD/gpu_out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
if [[ -f .gpu/pyext.tar.xz ]] && ! python3 -c "import ray, deepspeed" 2>/dev/null; then
  S=$(mktemp -d) && tar -xJf .gpu/pyext.tar.xz -C "$S" && export PYTHONPATH="$S:$PWD"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 WANDB_MODE=disabled
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-${TMPDIR:-/tmp}/inductor_cache}
PY=${PY:-python3}
if ! "$PY" -c "import torch" 2>/dev/null && [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; fi
if [[ $REHEARSE == 1 ]]; then
  export CUDA_VISIBLE_DEVICES="" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
r() { [[ $REHEARSE == 1 ]] && echo "$2" || echo "$1"; }  # r GPU_VALUE REHEARSAL_VALUE

run() {  # run NAME SECONDS [--junit] CMD...: log, then NAME.json
  local name=$1 secs=$2 xml=""; shift 2
  if [[ $1 == --junit ]]; then xml="$OUT/$name.xml"; shift; set -- "$@" "--junitxml=$xml"; fi
  echo "== $name: $*" | tee -a "$OUT/session.log"
  local t0=$SECONDS
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  tail -15 "$OUT/$name.log"
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/session.log"
  "$PY" bench/session_json.py step "$name" "$rc" "$((SECONDS - t0))" "$OUT/$name.log" $xml \
    > "$OUT/$name.json" || echo "== $name: no JSON written" | tee -a "$OUT/session.log"
  return 0
}

SMI=()
smi_start() {  # per-process GPU memory every 2 s (defect 5: parents/stable runs must not linger)
  command -v nvidia-smi > /dev/null || return 0
  nvidia-smi --query-compute-apps=timestamp,pid,process_name,used_memory --format=csv -l 2 \
    > "$OUT/smi_apps_$1.csv" 2>&1 &
  SMI=($!)
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,power.draw \
    --format=csv -l 2 > "$OUT/smi_gpu_$1.csv" 2>&1 &
  SMI+=($!)
}
smi_stop() {
  [[ ${#SMI[@]} -gt 0 ]] && { kill "${SMI[@]}" 2>/dev/null; wait "${SMI[@]}" 2>/dev/null; }
  SMI=()
  "$PY" bench/session_json.py smi "$OUT/smi_apps_$1.csv" "$OUT/smi_gpu_$1.csv" \
    > "$OUT/smi_$1.json"
}

ENV_PY='
import importlib, json, time, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
cuda = torch.cuda.is_available()
out = {"bench": "env", "torch": torch.__version__, "cuda": torch.version.cuda,
       "device": torch.cuda.get_device_name(0) if cuda else "cpu",
       "grouped_mm": hasattr(torch, "_grouped_mm")}
for m in ("triton", "deepspeed", "ray", "liger_kernel", "transformers", "numpy"):
    try: out[m] = getattr(importlib.import_module(m), "__version__", "?")
    except Exception as e: out[m] = "missing: " + type(e).__name__
B, H, S, D = (32, 8, 1024, 80) if cuda else (2, 2, 64, 16)
dev, dt = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
q = torch.randn(B, H, S, D, device=dev, dtype=dt, requires_grad=True)
sdpa = {}
for b in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH):
    try:
        with sdpa_kernel(b):
            for i in range(13):
                if i == 3:
                    cuda and torch.cuda.synchronize(); t = time.perf_counter()
                F.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
            cuda and torch.cuda.synchronize()
            sdpa[b.name] = round((time.perf_counter() - t) / 10 * 1e3, 3)
    except Exception as e: sdpa[b.name] = "unavailable: " + type(e).__name__
out["sdpa_ms_fwd_bwd"] = sdpa
out["sdpa_shape"] = [B, H, S, D]
print(json.dumps(out))
'

sweep_spec() {  # the 2-trial sweep: 15M on the GPU (0.5 GPU each: both at once), debug here
  local f=$1
  cat > "$f" <<EOF
sweep: gpu_session
base:
  model: {preset: $(r 15M debug), compile: $(r true false), chunked_loss: true}
  moe: {num_experts: 8, top_k: 2, router: {order: topk_softmax, loss_free_rate: 1.0e-3}}
  data: {source: synthetic, synthetic_vocab: $(r 512 32), synthetic_tokens: $(r 8000000 60000), seq_len: $(r 1024 32)}
  batch: {global_batch: $(r 32 8), micro_batch: $(r 32 8)}
  optim: {lr: 3.0e-3}
  schedule: {kind: wsd, warmup_steps: 2, decay_frac: 0.25}
  eval: {every_steps: $(r 50 2), batches: 2}
  tokens: $(r 6553600 2048)
  parent: {tokens: $(r 3276800 2048), lr: 8.0e-3, seed: 0}
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
TRAIN="bench/train_step.py --compile --chunked-loss"
TINY="--presets debug --steps 2 --seq 32 --vocab 512"
step() {
  case $1 in
    call1) step env; step tier; step tier_sweep; step layer ;;
    call2) step head; step mfu_dense; step mfu_moe; step step64 ;;
    call3) step core; step sweep; step compile; step profile ;;
    call4) step experts ;;
    spare) step step64_ckpt; step mfu_dense64 ;;
    env)
      { command -v nvidia-smi > /dev/null && { nvidia-smi; nvidia-smi -q -d CLOCK,POWER; }
        df -h "${TMPDIR:-/tmp}" .; nproc; free -g; } > "$OUT/env_host.log" 2>&1
      run env "$(r 40 180)" "$PY" -c "$ENV_PY" ;;
    tier)  # the Ray sweep test apart, so a hang there cannot take the others' results
      if [[ $REHEARSE == 1 ]]; then
        run tier 240 --junit "$PY" -m pytest $TIER -m "gpu and not slow"
      else
        run tier 240 --junit "$PY" -m pytest $TIER -m gpu -k "not sweep" --durations=10
      fi ;;
    tier_sweep)
      smi_start tier_sweep
      run tier_sweep "$(r 150 180)" --junit "$PY" -m pytest $TIER -m gpu -k sweep \
        $(r "" --collect-only)
      smi_stop tier_sweep ;;
    core)  # "all of tests/moe_core on CUDA"
      run core "$(r 200 180)" --junit "$PY" -m pytest -q -p no:cacheprovider --durations=10 \
        -m "not distributed$(r '' ' and not slow')" $(r tests/moe_core tests/moe_core/test_routing.py) ;;
    layer) run layer "$(r 110 180)" "$PY" bench/moe_layer.py \
             $(r "--device cuda" "--device cpu --tokens 256 --repeats 1") ;;
    head)  if [[ $REHEARSE == 1 ]]; then  # Liger runs under Triton's interpreter on the CPU
             TRITON_INTERPRET=1 run head 180 "$PY" bench/head.py --tokens 128 --d 32 \
               --vocab 256 --repeats 1
           else run head 60 "$PY" bench/head.py; fi ;;
    experts) if [[ $REHEARSE == 1 ]]; then  # Liger under Triton's interpreter, tiny shape
               TRITON_INTERPRET=1 LIGER_FUSED_MOE_AUTOTUNE=0 run experts 240 "$PY" \
                 bench/moe_experts.py --device cpu --check --shapes tiny --tokens 24 \
                 --repeats 1 --record "$OUT/kernel_choice.json"
             else run experts 240 "$PY" bench/moe_experts.py --device cuda --check \
                    --record "$OUT/kernel_choice.json"; fi ;;
    mfu_dense) run mfu_dense "$(r 150 180)" "$PY" $(r "$TRAIN" bench/train_step.py) \
                 --models dense $(r "--batch 128 --micro 128" "$TINY --batch 8 --micro 8") ;;
    mfu_dense64) run mfu_dense64 "$(r 150 180)" "$PY" $(r "$TRAIN" bench/train_step.py) \
                   --models dense $(r "--batch 64 --micro 64" "$TINY --batch 4 --micro 4") ;;
    mfu_moe) run mfu_moe "$(r 180 180)" "$PY" $(r "$TRAIN" bench/train_step.py) \
               --models moe $(r "--batch 32 --micro 32" "$TINY --batch 4 --micro 4") ;;
    step64) TORCH_LOGS=recompiles run step64 "$(r 150 180)" "$PY" \
              $(r "$TRAIN" bench/train_step.py) --models moe \
              $(r "--batch 64 --micro 64" "$TINY --batch 8 --micro 8") ;;
    step64_ckpt) run step64_ckpt "$(r 180 180)" "$PY" $(r "$TRAIN" bench/train_step.py) \
                   --models moe --activation-checkpointing \
                   $(r "--batch 64 --micro 64" "$TINY --batch 8 --micro 8") ;;
    sweep)
      local res; res=$(mktemp -d)
      sweep_spec "$res/spec.yaml"
      "$PY" -m sweeps.run "$res/spec.yaml" --dry-run > "$OUT/sweep_plan.log" 2>&1
      smi_start sweep
      UPCYCLE_CACHE="$res/cache" run sweep "$(r 150 300)" "$PY" -m sweeps.run "$res/spec.yaml" \
        --json --results "$res/r"
      smi_stop sweep
      du -sh "$res"/r/*/* > "$OUT/sweep_disk.log" 2>&1
      find "$res/r" -name summary.json -exec cp {} "$OUT/sweep_summary.json" \;
      rm -rf "$res" ;;
    compile) TORCH_LOGS=graph_breaks,recompiles run compile "$(r 90 180)" "$PY" \
               bench/compile_diag.py \
               $(r "--chunked-loss" "--backend eager --steps 2 --seq 32 --micro 4") ;;
    profile) run profile "$(r 100 180)" "$PY" bench/profile_step.py --moe \
               $(r "--compile --chunked-loss" "--steps 1 --warmup 1 --seq 32 --micro 4") ;;
    *) echo "unknown step $1 (call1 | call2 | call3 | call4 | spare, or a step of one)" >&2
       return 2 ;;
  esac
}

echo "== session $(date -u +%FT%TZ) rehearse=$REHEARSE out=$OUT: ${ARGS[*]}" \
  | tee -a "$OUT/session.log"
for s in "${ARGS[@]}"; do step "$s" || exit 2; done
"$PY" bench/session_json.py summary "$OUT" > "$OUT/summary.json.tmp" \
  && mv "$OUT/summary.json.tmp" "$OUT/summary.json"
cat "$OUT/summary.json"
