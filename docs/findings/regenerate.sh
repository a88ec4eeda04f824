#!/usr/bin/env bash
# Regenerates every number and plot on docs/findings.md: runs the shipped search spaces with
# `python -m sweeps.run` (local Ray, CPU presets) and writes each report with
# `python -m analysis.report` into docs/findings/<sweep>/. About 35 minutes on 2 CPU cores.
#   bash docs/findings/regenerate.sh            # everything
#   bash docs/findings/regenerate.sh top_k      # one sweep (and its report)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
ALL=(upcycle_lr upcycle_vs_dense router_order gating_lambda aux_coef granularity top_k
     expert_baselines transition_tau transition_cpt scaling_d1_d2)
SWEEPS=("${@:-${ALL[@]}}")
for s in "${SWEEPS[@]}"; do
  WANDB_MODE=offline "$PY" -m sweeps.run "search_spaces/$s.yaml" --json | tail -1
done
# every report, and docs/findings/index.md (ledger per sweep and all verdicts)
ONLY=$(IFS=,; echo "${ALL[*]}")
"$PY" -m analysis.report results --only "$ONLY" --baseline results/expert_baselines \
  --out docs/findings
# item 3's check: the same sweep with a near-uniform router at upcycling (init std 1e-3), so that
# softmax_topk with weight scaling starts exactly at the parent's loss
if [[ " ${SWEEPS[*]} " == *" router_order "* ]]; then
  WANDB_MODE=offline "$PY" -m sweeps.run search_spaces/router_order.yaml \
    --set base.moe.router.init_std=0.001 --results results/router_init --json | tail -1
  "$PY" -m analysis.report results/router_init/router_order \
    --out docs/findings/router_order_router_init_1e-3
fi
