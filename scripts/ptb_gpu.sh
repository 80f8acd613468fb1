#!/usr/bin/env bash
# The PTB medium configuration (Zaremba et al. 2014) on one GPU, for docs/ptb-example.md.
#
#   scripts/ptb_gpu.sh DATA_DIR OUT_DIR [SECONDS]
#
# Trains as one plain process on cuda:0 (39 epochs, or as many as fit in SECONDS: the example's
# --time-limit starts no epoch that would end after it, and the test perplexity is still
# computed), writing OUT_DIR/medium.log (per-epoch lines) and OUT_DIR/medium.jsonl (metrics) as
# it goes, so a run cut short still leaves its epochs. Then, with the time left, a short
# --backend ddp run under torchrun on the same GPU (NCCL), OUT_DIR/ddp_smoke.log.
# PTB_PYTHON (default python3) and PTB_MODULE (default dtlaunch.examples.ptb_lm) name the
# interpreter and the example's module; PYTHONPATH must let it import.
set -u -o pipefail
data=${1:?usage: ptb_gpu.sh DATA_DIR OUT_DIR [SECONDS]}
out=${2:?usage: ptb_gpu.sh DATA_DIR OUT_DIR [SECONDS]}
budget=${3:-540}
py=${PTB_PYTHON:-python3}
module=${PTB_MODULE:-dtlaunch.examples.ptb_lm}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
began=$SECONDS

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$py" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
"cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
    nproc
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

# Leave 40 s of the budget for the test evaluation, the start and the smoke run below.
train_limit=$((budget - 40 - (SECONDS - began)))
"$py" -m "$module" --config medium --device cuda --data-path "$data" \
    --metrics "$out/medium.jsonl" --time-limit "$train_limit" 2>&1 | tee "$out/medium.log"
status=$?
echo "medium: exit $status after $((SECONDS - began)) s"

left=$((budget - (SECONDS - began)))
if [ "$left" -gt 25 ]; then
    timeout $((left - 5)) "$py" -m torch.distributed.run --standalone --nproc-per-node 1 \
        -m "$module" --backend ddp --device cuda --config medium --data-path "$data" \
        --max-steps 400 --log-interval 100 --no-eval 2>&1 | tee "$out/ddp_smoke.log"
    echo "ddp smoke: exit $? after $((SECONDS - began)) s"
fi
exit "$status"
