#!/usr/bin/env bash
# Wave 1 of issue 28 in one device call of about 9 minutes: the eight variants of the `gpu` recipe in
# course_tools/waves/wave1.toml trained at once on one GPU, then every result and translation packed
# under $OUT.
#
#   on the GPU machine, from the repository root:  bash course_tools/gpu_wave1.sh
#   on a CPU, first (toy corpus, tiny model, 6 steps: the whole path, end to end):
#                                                   PYTHON=.venv/bin/python bash course_tools/gpu_wave1.sh --smoke
#
# Multi30k comes from $ATTN_MULTI30K_MIRROR (the loader's variable), else from the loader's cache
# (data/cache/multi30k/task1/raw); both are checked before any training, and nothing is downloaded.
# Settings (environment): PYTHON (default python3), OUT (default build/wave1-out), WAVE_FILE,
# WAVE_MAX_SECONDS (each run's training budget) and WAVE_DEADLINE (the wave's wall clock), which
# override the wave file's.
#
# What comes back under $OUT (8 files at most, 16 MiB each): wave.log (versions, nvidia-smi, progress,
# the table), table.md, table.json, results.tar.gz (per run: spec, log, result.json, summary, history,
# config, tokenizer, validation and test translations; gpu.csv: GPU use every 10 s) and
# weights.tar.part-* (every run's final weights in half precision, <run>/run/model.fp16.pt: unpack with
# `cat weights.tar.part-* | tar -x` beside results.tar.gz's files; `load_run` and
# `evaluation.evaluate(RUN, hypotheses_dir=...)` read them).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SMOKE=""
[[ "${1:-}" == "--smoke" ]] && SMOKE="--smoke"
PY=${PYTHON:-python3}
WAVE_FILE=${WAVE_FILE:-course_tools/waves/wave1.toml}
OUT=${OUT:-build/wave1${SMOKE:+-smoke}-out}
WORK=build/wave1${SMOKE:+-smoke}    # relative, inside the checkout: the logs name no machine's folders
NAME=$(basename "$WORK")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT" build && rm -rf "$WORK" && mkdir -p "$WORK"
log() { echo "$@" | tee -a "$OUT/wave.log"; }

# 1. the software and the GPU, for the record
"$PY" -c 'import sys, torch, tokenizers, sacrebleu
print("python", sys.version.split()[0], "| torch", torch.__version__, "| tokenizers", tokenizers.__version__,
      "| sacrebleu", sacrebleu.__version__, "| CUDA:", torch.cuda.get_device_name() if torch.cuda.is_available() else "none")' \
    2>&1 | tee -a "$OUT/wave.log" || { log "gpu_wave1: python or its packages are missing"; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi 2>&1 | tee -a "$OUT/wave.log"

# 2. the data, found the loader's way (mirror variable, else cache), without downloading
if [[ -z "$SMOKE" ]]; then
    "$PY" -c 'from attention_course.data import multi30k_file
for split in ("train", "val", "test_2016_flickr"):
    for lang in ("en", "de"):
        multi30k_file(split, lang, download=False, progress=False)
print("Multi30k en-de: train, val and test_2016_flickr found and verified")' 2>&1 | tee -a "$OUT/wave.log" \
        || { log "gpu_wave1: Multi30k not found: set ATTN_MULTI30K_MIRROR to a folder with the raw files (carry it)"; exit 1; }
fi

# 3. the wave (GPU use sampled alongside)
GPU_LOG=""
if [[ -z "$SMOKE" ]] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,power.draw --format=csv -l 10 >"$WORK/gpu.csv" 2>&1 &
    GPU_LOG=$!
fi
ARGS=("$WAVE_FILE" --out "$WORK" $SMOKE --poll "${WAVE_POLL:-20}")
[[ -n "${WAVE_MAX_SECONDS:-}" ]] && ARGS+=(--max-seconds "$WAVE_MAX_SECONDS")
[[ -n "${WAVE_DEADLINE:-}" ]] && ARGS+=(--deadline "$WAVE_DEADLINE")
"$PY" -m attention_course.wave "${ARGS[@]}" 2>&1 | tee -a "$OUT/wave.log"
STATUS=${PIPESTATUS[0]}
[[ -n "$GPU_LOG" ]] && kill "$GPU_LOG" 2>/dev/null

# 4. pack: the table as it is, everything but weights in one archive, the weights split below 16 MiB
cp "$WORK"/table.md "$WORK"/table.json "$OUT"/ 2>/dev/null
tar -C build -czf "$OUT/results.tar.gz" --exclude='*.pt' "$NAME"
(cd build && find "$NAME" -name model.fp16.pt | sort | tar -cf - -T -) | split -b 15m - "$OUT/weights.tar.part-"
log "gpu_wave1: exit status $STATUS; under \$OUT: $(cd "$OUT" && ls | tr '\n' ' ')"
exit "$STATUS"
