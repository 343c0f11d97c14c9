#!/usr/bin/env bash
# Several nodes of 8 GPUs; run the same command on every node:
#   NNODES=4 RDZV_HOST=node0 bash examples/gpt_multinode.sh [LAYOUT] [extra Megatron flags]
# (RDZV_HOST: a host every node can reach; RDZV_PORT default 29500; RDZV_ID names the job.)
# LAYOUT (default tp2_pp4): DP = 8 x NNODES / (TP x PP x CP):
#   tp2_pp4    TP2 inside a node, PP4 across nodes with 3 virtual chunks per stage: a model too
#              big for one node; the pipeline hops cross the slower inter-node links, TP stays on
#              NVLink, and VPP keeps the bubble small.
#   tp8        TP8 (one node per model replica), DP = NNODES: wide layers, nodes replicate.
#   tp4_cp2    TP4 CP2: long-context training across nodes (packed thd micro-batches, split per document).
set -euo pipefail
LAYOUT="${1:-tp2_pp4}"; shift || true
source "$(dirname "$0")/gpt_flags.sh"
NNODES="${NNODES:?set NNODES}"
RDZV_HOST="${RDZV_HOST:?set RDZV_HOST to a host every node can reach}"
case "$LAYOUT" in
  tp2_pp4) PARALLEL=(--tensor-model-parallel-size 2 --sequence-parallel --pipeline-model-parallel-size 4
                     --num-layers-per-virtual-pipeline-stage 2) ;;
  tp8)     PARALLEL=(--tensor-model-parallel-size 8 --sequence-parallel) ;;
  tp4_cp2) PARALLEL=(--tensor-model-parallel-size 4 --sequence-parallel --context-parallel-size 2) ;;
  *) echo "unknown LAYOUT $LAYOUT (tp2_pp4, tp8, tp4_cp2)" >&2; exit 2 ;;
esac
${DRY:+echo} torchrun --nproc-per-node 8 --nnodes "$NNODES" \
  --rdzv-backend c10d --rdzv-endpoint "$RDZV_HOST:${RDZV_PORT:-29500}" --rdzv-id "${RDZV_ID:-gpt-dpsched}" \
  "$REPO/scripts/pretrain_gpt_dpsched.py" "${GPT_FLAGS[@]}" "${PARALLEL[@]}" "$@"
