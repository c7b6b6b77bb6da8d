"""Patch an unpacked ``pb1-detectron2==0.6`` sdist so it installs as pure Python.

Usage: python scripts/patch_detectron2.py <unpacked-sdist-dir>

The sdist equals upstream detectron2 v0.6 but ships no C++ sources. We:
  1. build no extension (``ext_modules=[]``);
  2. add ``detectron2/_C.py``, a pure-Python stand-in whose compiled ops raise
     ``NotImplementedError`` (rotated boxes, deformable conv, fast COCOeval);
  3. move ``detectron2/model_zoo/configs`` to ``configs/`` so setup.py packages it;
  4. rewrite aliases removed from numpy>=1.24 (``np.int`` ...), Pillow>=10
     (``Image.LINEAR``) and the ``pkg_resources`` use in model_zoo, as upstream
     detectron2 later did, so modern numpy/Pillow/setuptools work;
  5. drop the ``black==21.4b2`` pin (only used by LazyConfig.save formatting).
Each step checks that its target text was found, so a different sdist fails loudly.
"""
import os
import re
import shutil
import sys

STAND_IN = '''"""Pure-Python stand-in for detectron2's C++ extension (installed by sparseclip_d2).

The PyPI sdist ``pb1-detectron2`` ships no C++ sources. Nothing in sparseclip_d2
needs these operators; calling one raises NotImplementedError.
"""


def _missing(name):
    def op(*args, **kwargs):
        raise NotImplementedError(
            f"detectron2._C.{name} is unavailable: detectron2 was installed without its "
            "C++ extension (pure-Python build by sparseclip_d2's scripts/setup.sh). "
            "Install upstream detectron2 from source to use it."
        )

    return op


def get_compiler_version():
    return "none (pure-Python build)"


def get_cuda_version():
    return "none (pure-Python build)"


def has_cuda():
    return False


box_iou_rotated = _missing("box_iou_rotated")
nms_rotated = _missing("nms_rotated")
roi_align_rotated_forward = _missing("roi_align_rotated_forward")
roi_align_rotated_backward = _missing("roi_align_rotated_backward")
deform_conv_forward = _missing("deform_conv_forward")
deform_conv_backward_input = _missing("deform_conv_backward_input")
deform_conv_backward_filter = _missing("deform_conv_backward_filter")
modulated_deform_conv_forward = _missing("modulated_deform_conv_forward")
modulated_deform_conv_backward = _missing("modulated_deform_conv_backward")
COCOevalMaskApi = _missing("COCOevalMaskApi")
InstanceAnnotation = _missing("InstanceAnnotation")
ImageEvaluation = _missing("ImageEvaluation")
'''

NUMPY_ALIASES = re.compile(r"\bnp\.(int|float|bool|str|object)\b(?![_0-9\w])")


def replace_once(path, old, new):
    with open(path) as f:
        text = f.read()
    if old not in text:
        sys.exit(f"patch_detectron2: expected text not found in {path}: {old!r}")
    with open(path, "w") as f:
        f.write(text.replace(old, new))


def main(src):
    setup_py = os.path.join(src, "setup.py")
    pkg = os.path.join(src, "detectron2")
    if not os.path.isfile(setup_py) or not os.path.isdir(pkg):
        sys.exit(f"patch_detectron2: {src} is not an unpacked detectron2 sdist")

    replace_once(setup_py, "ext_modules=get_extensions(),", "ext_modules=[],")
    replace_once(setup_py, '        "black==21.4b2",\n', "")

    with open(os.path.join(pkg, "_C.py"), "w") as f:
        f.write(STAND_IN)

    zoo_cfg = os.path.join(pkg, "model_zoo", "configs")
    top_cfg = os.path.join(src, "configs")
    if os.path.isdir(zoo_cfg) and not os.path.exists(top_cfg):
        shutil.move(zoo_cfg, top_cfg)
    if not os.path.isdir(top_cfg):
        sys.exit(f"patch_detectron2: no model-zoo configs found under {src}")

    replace_once(
        os.path.join(pkg, "data", "transforms", "transform.py"),
        "interp=Image.LINEAR",
        "interp=Image.BILINEAR",
    )
    zoo = os.path.join(pkg, "model_zoo", "model_zoo.py")
    replace_once(zoo, "import pkg_resources\n", "")
    replace_once(zoo, "pkg_resources.resource_filename(\n", "_resource_filename(\n")
    with open(zoo, "a") as f:
        f.write(
            "\n\ndef _resource_filename(package, resource):\n"
            "    # replaces pkg_resources.resource_filename (removed from setuptools>=81)\n"
            "    assert package == \"detectron2.model_zoo\", package\n"
            "    return os.path.join(os.path.dirname(os.path.abspath(__file__)), resource)\n"
        )

    changed = 0
    for root, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            with open(path) as f:
                text = f.read()
            new, n = NUMPY_ALIASES.subn(lambda m: m.group(1), text)
            if n:
                changed += n
                with open(path, "w") as f:
                    f.write(new)
    if changed == 0:
        sys.exit("patch_detectron2: no numpy aliases found; unexpected sdist contents")
    print(f"patch_detectron2: patched {src} ({changed} numpy aliases rewritten)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
