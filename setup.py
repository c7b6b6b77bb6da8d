"""sparseclip_d2: training-free sparse (alpha-entmax) CLIP attention for dense
open-vocabulary prediction, as a detectron2 plugin."""
from setuptools import find_packages, setup

setup(
    name="sparseclip_d2",
    version="0.1.0",
    description="Training-free sparse CLIP attention for dense open-vocabulary prediction (detectron2 plugin)",
    long_description=open("README.md").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.9",
    packages=find_packages(include=("sparseclip_d2", "sparseclip_d2.*")),
    package_data={"sparseclip_d2": ["data/classnames/*.txt", "data/classnames/*/*.txt", "data/classnames/SOURCES.md", "reference/*.csv", "attention/csrc/*.cpp"]},
    install_requires=[
        "torch>=2.1",
        "torchvision>=0.16",
        "open_clip_torch>=2.24",
        # timm vision towers of open_clip (SigLIP, EVA, PE-Core, MobileCLIP-B)
        "timm>=1.0.15",
        # builds the fused alpha-entmax CPU kernel (torch.utils.cpp_extension, first use)
        "ninja",
        "fvcore>=0.1.5,<0.1.6",
        "pycocotools>=2.0.2",
        "opencv-python-headless",
        "numpy",
        "Pillow",
        "PyYAML",
        "tqdm",
        "matplotlib",
        "imgviz>=1.7",
        # TensorBoard event files of sweep runs (detectron2's TensorboardXWriter uses
        # torch.utils.tensorboard, which needs the tensorboard package)
        "tensorboard",
        # detectron2 (>=0.6) is required but not declared here: it is not on PyPI under
        # its own name and has two valid distributions - the patched `pb1-detectron2==0.6`
        # sdist that scripts/setup.sh installs, or upstream from its repository
        # (pip install 'git+https://github.com/facebookresearch/detectron2.git').
        # `import sparseclip_d2` fails with install instructions when it is missing.
    ],
    extras_require={
        # the `entmax` package is the independent reference of the tests and the baseline of
        # tools/benchmark_entmax.py; the library has its own alpha-entmax
        "test": ["pytest>=7", "imgviz>=1.7", "entmax>=1.3"],
        "bench": ["entmax>=1.3"],
        # SigLIP / SigLIP 2 tokenizers (open_clip's HFTokenizer loads them with transformers)
        "hf": ["transformers"],
        # tools/sweep.py --launcher submitit (Slurm, local and debug executors)
        "cluster": ["submitit>=1.5"],
    },
)
