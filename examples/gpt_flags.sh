# Shared by the launch recipes (sourced): model, optimizer and data flags of a ~1.3B GPT
# (24 layers, hidden 2048), bf16, Transformer Engine, trained with --dp-schedule.
# Override with environment variables: DATA (a .jsonl of {"tokens": [...]} lines), VOCAB_SIZE
# (ids in DATA must be below it), MAX_TOKENS_PER_GPU (the cap on one micro-batch on one GPU, counted
# as collated: packed thd sequences rounded to the layout's pad multiple, or bshd rows x the longest row),
# GLOBAL_BATCH, TRAIN_ITERS, SAVE;
# DPSCHED=0 trains without --dp-schedule (MICRO_BATCH samples per micro-batch) for comparison.
DATA="${DATA:?set DATA to a .jsonl corpus, one tokens list per line}"
VOCAB_SIZE="${VOCAB_SIZE:-128256}"
SEQ_LENGTH="${SEQ_LENGTH:-8192}"            # longest sample allowed (and position range)
MAX_TOKENS_PER_GPU="${MAX_TOKENS_PER_GPU:-16384}"
GLOBAL_BATCH="${GLOBAL_BATCH:-256}"         # samples per optimizer step, as without --dp-schedule
TRAIN_ITERS="${TRAIN_ITERS:-10000}"
SAVE="${SAVE:-checkpoints/gpt-dpsched}"
export CUDA_DEVICE_MAX_CONNECTIONS=1        # Megatron requires it with TP or CP (comm/compute overlap)
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

GPT_FLAGS=(
  --num-layers 24 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 5632
  --group-query-attention --num-query-groups 4 --swiglu --normalization RMSNorm --disable-bias-linear
  --position-embedding-type rope --untie-embeddings-and-output-weights
  --seq-length "$SEQ_LENGTH" --max-position-embeddings "$SEQ_LENGTH"
  --transformer-impl transformer_engine --bf16
  --attention-dropout 0.0 --hidden-dropout 0.0
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 200 --weight-decay 0.1 --clip-grad 1.0
  --global-batch-size "$GLOBAL_BATCH" --train-iters "$TRAIN_ITERS"
  --use-distributed-optimizer --overlap-grad-reduce
  --tokenizer-type NullTokenizer --vocab-size "$VOCAB_SIZE"
  --data-path "$DATA" --split 100,0,0 --eval-iters 0
  --save "$SAVE" --save-interval 1000 --log-interval 10
)
if [ "${DPSCHED:-1}" = 1 ]; then
  # dp-schedule: plan every global batch under the token cap; the micro-batch size stays 1.
  GPT_FLAGS+=(--micro-batch-size 1 --dp-schedule --dp-schedule-max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
              --dp-schedule-verify check)
else
  # Megatron's ordinary path for comparison: fixed micro-batches padded to --seq-length.
  GPT_FLAGS+=(--micro-batch-size "${MICRO_BATCH:-1}")
fi
