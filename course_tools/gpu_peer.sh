#!/usr/bin/env bash
# Issue 28, item 4, in one device call of about 9 minutes: the `gpu` recipe's model and Hugging Face's
# MarianMTModel of the same size, trained one after the other, each alone on the GPU, on the same
# batches with the same loop (`attn-course bench-peer`), then the report and translations under $OUT.
#
#   on the GPU machine, from the repository root:  bash course_tools/gpu_peer.sh
#   on a CPU, first (toy corpus, 20 steps, the whole path end to end):
#                                                   PYTHON=.venv/bin/python bash course_tools/gpu_peer.sh --smoke
#
# Multi30k comes from $ATTN_MULTI30K_MIRROR (the loader's variable), else from the loader's cache; it is
# checked before any training and nothing is downloaded. Settings (environment): PYTHON (default
# python3), OUT (default build/peer-out), PEER (marian or m2m100), PEER_INIT (library or course:
# the peer's own initialisation, default, or the course model's), PEER_STEPS (each model's step
# budget, default 6000), PEER_MAX_SECONDS (each model's training-time budget, default 220: two models,
# their evaluations and start-up stay under 10 minutes), PEER_EVAL_EVERY (default 500).
#
# What comes back under $OUT: peer.log (versions, nvidia-smi, progress, the table), peer.json (every
# number, each model's validation curve), peer.md (the table the README quotes), and each model's
# test translations, greedy and beam 5.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SMOKE=""
[[ "${1:-}" == "--smoke" ]] && SMOKE="--smoke"
PY=${PYTHON:-python3}
OUT=${OUT:-build/peer${SMOKE:+-smoke}-out}
WORK=build/peer${SMOKE:+-smoke}    # relative, inside the checkout: the logs name no machine's folders
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
log() { echo "$@" | tee -a "$OUT/peer.log"; }

# 1. the software and the GPU, for the record
"$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "| torch", torch.__version__, "| transformers", transformers.__version__,
      "| CUDA:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' \
    2>&1 | tee -a "$OUT/peer.log" || { log "gpu_peer: python or its packages are missing"; exit 1; }
[[ -z "$SMOKE" ]] && command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 | tee -a "$OUT/peer.log"

# 2. the comparison
if [[ -n "$SMOKE" ]]; then
    ARGS=(--config toy --max-steps 20 --eval-every 10 --threshold 5 --threshold 50 --threads 1)
else
    "$PY" -c 'from attention_course.data import multi30k_file
for split in ("train", "val", "test_2016_flickr"):
    for lang in ("en", "de"):
        multi30k_file(split, lang, download=False, progress=False)
print("Multi30k en-de: train, val and test_2016_flickr found and verified")' 2>&1 | tee -a "$OUT/peer.log" \
        || { log "gpu_peer: Multi30k not found: set ATTN_MULTI30K_MIRROR to a folder with the raw files (carry it)"; exit 1; }
    ARGS=(--config gpu --max-steps "${PEER_STEPS:-6000}" --max-seconds "${PEER_MAX_SECONDS:-220}"
          --eval-every "${PEER_EVAL_EVERY:-500}" --beam 5)
fi
"$PY" -m course_tools.cli bench-peer --peer "${PEER:-marian}" --peer-init "${PEER_INIT:-library}" --out "$WORK" --no-progress "${ARGS[@]}" 2>&1 | tee -a "$OUT/peer.log"
STATUS=${PIPESTATUS[0]}

# 3. what comes back
cp "$WORK"/peer.json "$WORK"/peer.md "$WORK"/*.beam* "$OUT"/ 2>/dev/null
log "gpu_peer: exit status $STATUS; under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$STATUS"
