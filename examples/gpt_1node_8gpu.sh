#!/usr/bin/env bash
# One node, 8 GPUs: bash examples/gpt_1node_8gpu.sh [LAYOUT] [extra Megatron flags]
# LAYOUT (default dp8) picks the parallel layout; DP = 8 / (TP x PP x CP):
#   dp8        TP1 PP1, DP=8: the model, its gradients and optimizer shards fit on one GPU;
#              the simplest and usually fastest choice for models up to a few billion parameters.
#   tp2        TP2 (+ sequence parallelism), DP=4: the model needs two GPUs' memory; keep TP
#              inside the NVLink domain.
#   tp2_pp2    TP2 PP2 with an interleaved (virtual) pipeline of 2 chunks per stage, DP=2:
#              too big for TP alone; VPP shrinks the pipeline bubble; the planner picks micro-batch
#              counts that the interleaved schedule accepts.
#   cp2        context parallelism 2, DP=4: very long samples (a micro-batch holds up to cap x CP tokens across its CP group);
#              packed (thd) micro-batches, each sequence split per document over the CP ranks.
set -euo pipefail
LAYOUT="${1:-dp8}"; shift || true
source "$(dirname "$0")/gpt_flags.sh"
case "$LAYOUT" in
  dp8)     PARALLEL=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 1) ;;
  tp2)     PARALLEL=(--tensor-model-parallel-size 2 --sequence-parallel) ;;
  tp2_pp2) PARALLEL=(--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 2
                     --num-layers-per-virtual-pipeline-stage 6) ;;
  cp2)     PARALLEL=(--context-parallel-size 2) ;;
  *) echo "unknown LAYOUT $LAYOUT (dp8, tp2, tp2_pp2, cp2)" >&2; exit 2 ;;
esac
${DRY:+echo} torchrun --nproc-per-node 8 --nnodes 1 --standalone \
  "$REPO/scripts/pretrain_gpt_dpsched.py" "${GPT_FLAGS[@]}" "${PARALLEL[@]}" "$@"
