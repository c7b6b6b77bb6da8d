#!/usr/bin/env bash
# The methods benchmark on a CUDA GPU (issue 46): every method against its upstream in fp32 and in
# fp16 (both sides under torch.autocast), images/s, peak GPU memory and their ratios, FLOPs and the
# share of the GPU's matmul peak; writes docs/efficiency_gpu_fp32.md and docs/efficiency_gpu_fp16.md.
#
#   UPSTREAM=/path/to/checkouts bash tools/benchmark_methods_gpu.sh [more benchmark_methods.py options]
#
# UPSTREAM holds one checkout per method, named as its repository (SCLIP, ClearCLIP, NACLIP, ResCLIP,
# SC-CLIP, SFP, ITACLIP, GEM, CLIP_Surgery, PEARL, GLA-CLIP, Talk2DINO, ... and dino, dinov2; the commits
# are in `python tools/benchmark_methods.py --help`); a method whose checkout is missing is left out, and
# one whose entry drives the CPU only (UpstreamEntry.cuda False) gets no upstream figure.
# PYTHON (default: python) runs the tool; <METHOD>_PYTHON the upstream worker of METHOD where it needs
# another environment (GEM_PYTHON: open_clip_torch<=2.23.0; MASKCLIP_PYTHON: scripts/upstream_envs/maskclip.sh).
# Without CUDA it stops at once, saying so; the CPU table (docs/efficiency.md) does not use it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python}
UPSTREAM=${UPSTREAM:?set UPSTREAM to the folder holding the upstream checkouts}
"$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else
  "benchmark_methods_gpu.sh: torch.cuda.is_available() is False (torch %s, CUDA %s): no GPU here; the CPU table is tools/benchmark_methods.py --doc docs/efficiency.md" % (torch.__version__, torch.version.cuda))'
# every registered entry, with the folder its checkout has under UPSTREAM (the repository's name);
# an interpreter for a method's upstream worker from <METHOD>_PYTHON (GEM_PYTHON, MASKCLIP_PYTHON, ...)
methods=() ; paths=()
while read -r m dir; do
  if [ -d "$UPSTREAM/$dir" ]; then
    methods+=("$m"); paths+=("--$m" "$UPSTREAM/$dir")
    var="$(echo "$m" | tr '[:lower:]' '[:upper:]')_PYTHON"
    [ -n "${!var:-}" ] && paths+=("--$m-python" "${!var}")
  fi
done < <("$PYTHON" -c 'from sparseclip_d2.benchmarks.entries import entries
for m, e in entries().items(): print(m, e.repo.split("/")[1])')
[ ${#methods[@]} -gt 0 ] || { echo "benchmark_methods_gpu.sh: no checkout under $UPSTREAM" >&2; exit 2; }
# the torch.hub checkouts the proxy methods' upstreams load (--dino, --dinov2), named as their repositories
[ -d "$UPSTREAM/dino" ] && paths+=(--dino "$UPSTREAM/dino")
[ -d "$UPSTREAM/dinov2" ] && paths+=(--dinov2 "$UPSTREAM/dinov2")
for dtype in fp32 fp16; do
  "$PYTHON" tools/benchmark_methods.py --device cuda --dtype "$dtype" --methods "${methods[@]}" "${paths[@]}" \
      --doc "docs/efficiency_gpu_$dtype.md" --json "efficiency_gpu_$dtype.json" "$@"
done
