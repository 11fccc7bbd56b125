#!/usr/bin/env bash
# Issue 28's two engine measurements, each one device call, each measured side by side in that call:
#
#   peer     (item 4, about 9 minutes) the `gpu` recipe's model and Hugging Face's MarianMTModel of the
#            same size, trained one after the other, each alone on the GPU, on the same batches with the
#            same loop (`attn-course bench-peer`): steady tokens/s, seconds to validation BLEU 38 and 40,
#            test BLEU after the same steps;
#   compile  (item 5, about 4 minutes) the `gpu` recipe's training step eager against torch.compile
#            (inductor, dynamic shapes, lengths bucketed), over the same batches (`attn-course
#            bench-compile`), and again with CUDA graphs (mode reduce-overhead).
#
#   on the GPU machine, from the repository root:  bash course_tools/gpu_bench.sh peer     (or compile)
#   on a CPU, first (toy corpus, a few steps, the whole path end to end):
#                                                   PYTHON=.venv/bin/python bash course_tools/gpu_bench.sh peer --smoke
#
# Multi30k comes from $ATTN_MULTI30K_MIRROR (the loader's variable), else from the loader's cache; it is
# checked before anything runs and nothing is downloaded. Settings (environment): PYTHON (default
# python3), OUT (default build/<what>-out); for peer: PEER (marian or m2m100), PEER_INIT (library, the
# default, or course: the course model's initialisation), PEER_STEPS (each model's step budget, default
# 6000), PEER_MAX_SECONDS (each model's training-time budget, default 220: two models, their evaluations
# and start-up stay under 10 minutes), PEER_EVAL_EVERY (default 500); for compile: COMPILE_STEPS
# (batches per pass, default 200) and COMPILE_BUCKET (default 8).
#
# What comes back under $OUT: <what>.log (versions, nvidia-smi, progress, the results), and for peer
# peer.json (every number, each model's validation curve), peer.md (the table the README quotes) and
# each model's test translations, greedy and beam 5; for compile compile.json and compile-cudagraphs.json.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
WHAT=${1:-}
[[ "$WHAT" == peer || "$WHAT" == compile ]] || { echo "usage: $0 peer|compile [--smoke]" >&2; exit 2; }
SMOKE=""
[[ "${2:-}" == "--smoke" ]] && SMOKE="--smoke"
PY=${PYTHON:-python3}
OUT=${OUT:-build/$WHAT${SMOKE:+-smoke}-out}
WORK=build/$WHAT${SMOKE:+-smoke}    # relative, inside the checkout: the logs name no machine's folders
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error
mkdir -p "$OUT" && rm -rf "$WORK" && mkdir -p "$WORK"
LOG="$OUT/$WHAT.log"
log() { echo "$@" | tee -a "$LOG"; }
cli() { "$PY" -m course_tools.cli "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

# 1. the software and the GPU, for the record
"$PY" -c 'import sys, torch, transformers
print("python", sys.version.split()[0], "| torch", torch.__version__, "| transformers", transformers.__version__,
      "| CUDA:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' \
    2>&1 | tee -a "$LOG" || { log "gpu_bench: python or its packages are missing"; exit 1; }
[[ -z "$SMOKE" ]] && command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 | tee -a "$LOG"

# 2. the data, found the loader's way (mirror variable, else cache), without downloading
if [[ -z "$SMOKE" ]]; then
    "$PY" -c 'from attention_course.data import multi30k_file
for split in ("train", "val", "test_2016_flickr"):
    for lang in ("en", "de"):
        multi30k_file(split, lang, download=False, progress=False)
print("Multi30k en-de: train, val and test_2016_flickr found and verified")' 2>&1 | tee -a "$LOG" \
        || { log "gpu_bench: Multi30k not found: set ATTN_MULTI30K_MIRROR to a folder with the raw files (carry it)"; exit 1; }
fi

# 3. the measurement
if [[ "$WHAT" == peer ]]; then
    if [[ -n "$SMOKE" ]]; then
        ARGS=(--config toy --max-steps 20 --eval-every 10 --threshold 5 --threshold 50 --threads 1)
    else
        ARGS=(--config gpu --max-steps "${PEER_STEPS:-6000}" --max-seconds "${PEER_MAX_SECONDS:-220}"
              --eval-every "${PEER_EVAL_EVERY:-500}" --beam 5)
    fi
    cli bench-peer --peer "${PEER:-marian}" --peer-init "${PEER_INIT:-library}" --out "$WORK" --no-progress "${ARGS[@]}"
    STATUS=$?
    cp "$WORK"/peer.json "$WORK"/peer.md "$WORK"/*.beam* "$OUT"/ 2>/dev/null
else
    if [[ -n "$SMOKE" ]]; then
        ARGS=(--config toy --steps 3 --backend aot_eager --threads 1)
        MODES=("")
    else
        ARGS=(--config gpu --steps "${COMPILE_STEPS:-200}")
        MODES=("" reduce-overhead)
    fi
    STATUS=0
    for MODE in "${MODES[@]}"; do
        NAME=compile${MODE:+-cudagraphs}
        cli bench-compile "${ARGS[@]}" --bucket "${COMPILE_BUCKET:-8}" ${MODE:+--mode "$MODE"} --out "$WORK/$NAME" || STATUS=1
        cp "$WORK/$NAME/compile.json" "$OUT/$NAME.json" 2>/dev/null
    done
fi
log "gpu_bench $WHAT: exit status $STATUS; under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$STATUS"
