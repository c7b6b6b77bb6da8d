#!/usr/bin/env bash
# The interpreter of MaskCLIP's upstream side (tools/agreement.py --method maskclip
# --upstream-python DIR/bin/python; tools/benchmark_methods.py --maskclip-python DIR/bin/python):
# chongzhou96/MaskCLIP at 245d31f is MMSegmentation 0.x code and imports mmcv 1.x, which the
# project's environment cannot hold beside its own packages. This makes a separate venv:
#
#   bash scripts/upstream_envs/maskclip.sh DIR [PROJECT_VENV]
#
# DIR holds what MaskCLIP needs and the project's venv has not:
# - mmcv 1.4.8, the pure-Python package (no compiled mmcv.ops: MMCV_WITH_OPS=0), from its PyPI
#   sdist (--no-build-isolation: its setup.py imports torch); inside MaskCLIP's accepted range
#   (mmseg/__init__.py at 245d31f: MMCV_MIN = '1.3.13', MMCV_MAX = '1.5.0'); its pure-Python
#   dependencies addict, pyyaml and yapf 0.40.1 (0.40.2 drops the `verify` argument mmcv 1.4 passes);
# - prettytable (MaskCLIP requirements/runtime.txt);
# - OpenAI's `clip` package, which its tools/maskclip_utils scripts import (its README installs
#   openai/CLIP; openai-clip 1.0.1 is that code's PyPI release), with ftfy, regex and tqdm.
# torch, torchvision, numpy, opencv and Pillow are the project venv's own (PROJECT_VENV, default
# this checkout's .venv made by scripts/setup.sh): a .pth file puts its site-packages after DIR's,
# so both sides of a row run the same torch build. The mmcv.ops names mmseg imports are stand-ins
# in the entry (sparseclip_d2/methods/maskclip/upstream.py), raising if called.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DIR="${1:?usage: bash scripts/upstream_envs/maskclip.sh DIR [PROJECT_VENV]}"
PROJECT_VENV="$(cd "${2:-$REPO/.venv}" && pwd)"
PROJECT_SITE="$("$PROJECT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PROJECT_VENV/bin/python" -c 'import torch, torchvision, numpy, cv2, PIL' \
  || { echo "maskclip.sh: $PROJECT_VENV lacks torch/torchvision/numpy/cv2/Pillow; run scripts/setup.sh first" >&2; exit 1; }
BASE_PY="$("$PROJECT_VENV/bin/python" -c 'import sys; print(sys._base_executable)')"
"$BASE_PY" -m venv "$DIR"
SITE="$("$DIR/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$PROJECT_SITE" > "$SITE/zz_sparseclip_project_venv.pth"
PIP=("$DIR/bin/python" -m pip install -q)
"${PIP[@]}" "setuptools<81" wheel
"${PIP[@]}" addict pyyaml "yapf==0.40.1" prettytable ftfy regex tqdm
MMCV_WITH_OPS=0 "${PIP[@]}" --no-build-isolation --no-deps "mmcv==1.4.8"
"${PIP[@]}" --no-deps "openai-clip==1.0.1"
"$DIR/bin/python" - <<'PY'
import clip, cv2, mmcv, numpy, torch
assert mmcv.__version__ == "1.4.8", mmcv.__version__
print(f"maskclip upstream venv: mmcv {mmcv.__version__}, torch {torch.__version__} ({torch.__file__}), numpy {numpy.__version__}")
PY
