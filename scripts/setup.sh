#!/usr/bin/env bash
# One-command environment setup for sparseclip_d2 (CPU machines with access to
# the package registries only; no GitHub, no model hubs).
#
#   bash scripts/setup.sh            # creates ./.venv
#   SPARSECLIP_VENV=/path/venv bash scripts/setup.sh
#
# A venv is bound to the checkout whose setup installed sparseclip_d2 into it (editable):
# setup refuses a venv bound to another checkout (scripts/check_venv_binding.py says which
# and how to fix it); SPARSECLIP_REBIND=1 reinstalls it for this checkout.
#
# Steps: venv -> torch/torchvision -> detectron2 0.6 from the PyPI sdist
# `pb1-detectron2` (sha256 checked, patched: no C++ extension, pure-Python
# `_C` stand-in, packaged model-zoo configs, numpy>=1.24 / Pillow>=10 aliases
# rewritten, no `black` pin, no pkg_resources) -> this package in editable
# mode with the `test` extra -> `pip check`.  Idempotent: when the venv is
# already complete for the current setup inputs it only verifies and exits.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${SPARSECLIP_VENV:-$REPO/.venv}"
PY_BOOT="${SPARSECLIP_PYTHON:-python3}"
TORCH_SPEC="torch==2.14.1 torchvision==0.29.1"
D2_SDIST="pb1-detectron2==0.6"
D2_SHA256="5d2e9e51e523ec72f6a31cca04b0a515492e9514b773a3d134cedc0677170b29"
STAMP="$VENV/.sparseclip_setup_stamp"

log() { printf '[setup] %s\n' "$*"; }
fail() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

# The stamp records the inputs of this setup; when they change, setup reruns.
inputs_hash() {
  cat "$REPO/scripts/setup.sh" "$REPO/setup.py" "$REPO/pyproject.toml" | sha256sum | cut -d' ' -f1
}

verify() {
  "$VENV/bin/python" - <<'PY'
import importlib
for name in ("torch", "torchvision", "detectron2", "open_clip", "entmax", "sparseclip_d2", "pytest", "xdist", "imgviz", "sklearn", "scipy", "mess"):
    importlib.import_module(name)
import detectron2.data, detectron2.engine, detectron2.evaluation, detectron2.utils.visualizer  # noqa: F401
import mess.datasets, mess.evaluation.sem_seg_evaluation  # noqa: F401  (the `mess` extra: MESS's registration and evaluator)
PY
  "$VENV/bin/python" -m pip check >/dev/null
}

# The fused alpha-entmax CPU kernel: built here, ahead of time, into a directory named by
# the hash of its source, flags, compiler and torch version (see
# sparseclip_d2/attention/_entmax_cpu.py; root $SPARSECLIP_KERNEL_DIR, else
# $TORCH_EXTENSIONS_DIR/sparseclip_d2, else ~/.cache/sparseclip_d2/kernels), so runs and tests
# start warm and no other checkout or venv can load or rebuild it.  A cold build takes about
# a minute; an existing one loads in about a second.  Without it the first CPU call builds it.
warm_kernel() {
  "$VENV/bin/python" - <<'PY' || fail "building the alpha-entmax CPU kernel failed (needs a C++ compiler and ninja); set SPARSECLIP_ENTMAX_KERNEL=0 to use the pure-torch path"
import logging, time
logging.basicConfig(level=logging.INFO, format="[setup] %(message)s")
from sparseclip_d2.attention import _entmax_cpu
name, _, build_dir = _entmax_cpu.kernel_spec()
start = time.perf_counter()
_entmax_cpu.load_kernel(raise_errors=True)
print(f"[setup] alpha-entmax CPU kernel {name} ready in {time.perf_counter() - start:.1f} s ({build_dir})")
PY
}

# An existing venv whose editable install points at another checkout would run that
# checkout's sparseclip_d2 under this checkout's tools/ (and pass `verify`): refuse, with the
# fixes, unless SPARSECLIP_REBIND=1 asks to reinstall it for this checkout.
REBIND=0
if [[ -x "$VENV/bin/python" ]]; then
  set +e
  BINDING="$(env -u PYTHONPATH "$VENV/bin/python" "$REPO/scripts/check_venv_binding.py" "$REPO" 2>&1)"
  BOUND=$?
  set -e
  if [[ "$BOUND" == 3 ]]; then
    if [[ "${SPARSECLIP_REBIND:-0}" == 1 ]]; then
      log "SPARSECLIP_REBIND=1: reinstalling $VENV for this checkout ($REPO); was: $BINDING"
      REBIND=1
    else
      fail "$BINDING"
    fi
  elif [[ "$BOUND" != 0 ]]; then
    fail "could not check which checkout $VENV belongs to: $BINDING"
  fi
fi

# A font for CJK class names in the overlays (sparseclip_d2/utils/overlays.py FALLBACK_FONTS):
# Debian's fonts-wqy-microhei (about 5 MB) where apt-get can install it; otherwise a note
# (the figures then draw such names as boxes and log a warning naming the characters).
install_cjk_font() {
  local f
  for f in /usr/share/fonts/truetype/wqy/wqy-microhei.ttc /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc \
           /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc; do
    [[ -f "$f" ]] && return 0
  done
  if command -v apt-get >/dev/null && [[ "$(id -u)" == 0 ]]; then
    log "installing a CJK font for the figures (apt-get install fonts-wqy-microhei)"
    apt-get install -y -q fonts-wqy-microhei >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q fonts-wqy-microhei >/dev/null 2>&1; } \
      || log "WARNING: could not install fonts-wqy-microhei; CJK class names will be drawn as boxes"
  else
    log "note: no CJK font found; install fonts-wqy-microhei or fonts-noto-cjk for CJK class names in figures"
  fi
}

WANT="$(inputs_hash)"
if [[ "$REBIND" == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  if verify && warm_kernel; then
    log "environment at $VENV is complete and up to date (nothing changed)"
    exit 0
  fi
  log "stamp present but verification failed; reinstalling"
fi

command -v "$PY_BOOT" >/dev/null || fail "python interpreter '$PY_BOOT' not found (set SPARSECLIP_PYTHON)"
if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating virtual environment at $VENV"
  "$PY_BOOT" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)

# torch's x86_64 wheel is the CUDA build: with everything else the venv holds 6.8 GiB (measured
# 2026-12-08, `du -sh .venv`). A disk that fills half-way leaves pip's "No space left on device"
# after minutes (a CI run stopped so); say it first, with the figures.
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  NEED_KB=$((7 * 1024 * 1024))
  FREE_KB="$(df -Pk "$VENV" | awk 'NR == 2 {print $4}')"
  if [[ -n "$FREE_KB" && "$FREE_KB" -lt "$NEED_KB" ]]; then
    fail "installing torch needs about 7 GiB free on the file system of $VENV; it has $((FREE_KB / 1024)) MiB ($(df -Ph "$VENV" | awk 'NR == 2 {print $6}')). Free space there, or set SPARSECLIP_VENV to a path on another disk"
  fi
fi
log "installing $TORCH_SPEC"
"${PIP[@]}" install -q $TORCH_SPEC

D2_OK=0
if "$VENV/bin/python" -c "import detectron2, detectron2._C, detectron2.model_zoo as m, os; assert os.path.isdir(os.path.join(os.path.dirname(m.__file__), 'configs'))" 2>/dev/null; then
  D2_OK=1
  log "detectron2 already installed ($("$VENV/bin/python" -c 'import detectron2; print(detectron2.__version__)'))"
fi

if [[ "$D2_OK" == 0 ]]; then
  WORK="$(mktemp -d)"
  trap 'rm -rf "$WORK"' EXIT
  log "downloading the $D2_SDIST sdist"
  # The sdist's setup.py imports torch, hence --no-build-isolation after torch.
  "${PIP[@]}" download -q --no-deps --no-binary=:all: --no-build-isolation "$D2_SDIST" -d "$WORK"
  TARBALL="$(ls "$WORK"/pb1-detectron2-0.6.tar.gz)"
  GOT="$(sha256sum "$TARBALL" | cut -d' ' -f1)"
  [[ "$GOT" == "$D2_SHA256" ]] || fail "sha256 mismatch for $TARBALL: got $GOT, expected $D2_SHA256"
  tar -xzf "$TARBALL" -C "$WORK"
  SRC="$WORK/pb1-detectron2-0.6"
  log "patching detectron2 sources for a pure-Python build"
  "$VENV/bin/python" "$REPO/scripts/patch_detectron2.py" "$SRC"
  "${PIP[@]}" install -q --no-build-isolation "$SRC"
fi

log "installing sparseclip_d2 (editable, with the test, cluster, app and mess extras)"
"${PIP[@]}" install -q --no-build-isolation -e "$REPO[test,cluster,app,mess]"
env -u PYTHONPATH "$VENV/bin/python" "$REPO/scripts/check_venv_binding.py" "$REPO" >/dev/null \
  || fail "after the editable install, $VENV still does not import this checkout's sparseclip_d2 (another .pth or site path comes first?)"

# Headless Chromium for tests/app/test_app_browser.py (Playwright drives Debian's build; its own browser download is not used)
command -v chromium >/dev/null || { log "installing Debian's chromium"; apt-get install -y -q chromium >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || fail "apt-get install chromium failed"; }
# Slurm and munge for the local single-node cluster (scripts/local_slurm.py) that tests/sweeps/test_slurm_cluster.py runs sweeps on
{ command -v slurmctld && command -v slurmd && command -v munged; } >/dev/null || { log "installing Debian's slurm-wlm and munge"; apt-get install -y -q slurm-wlm munge >/dev/null || { apt-get update -q >/dev/null && apt-get install -y -q slurm-wlm munge >/dev/null; } || fail "apt-get install slurm-wlm munge failed"; }

log "pip check"
"${PIP[@]}" check

verify || fail "verification import failed after install"
install_cjk_font
log "building the fused alpha-entmax CPU kernel ahead of time (about 1 min when cold)"
warm_kernel
echo "$WANT" > "$STAMP"
log "done: activate with 'source $VENV/bin/activate'"
