"""ADE20K-847 and Pascal Context-459 prepared as CAT-Seg prepares them
(``tools/prepare_datasets.py ade847`` / ``context459``): the validation split only, labels as
uint16 TIFFs (a class index per pixel; 847 and 459 classes do not fit 8 bits).

The facts, from cvlab-kaist/CAT-Seg @ 6d3a188:

- ADE20K-847 (``datasets/prepare_ade20k_full.py``): the ADE20K 2021 release
  (``ADE20K_2021_17_01/index_ade20k.pkl``: lists ``folder`` and ``filename``); an image is in
  the validation split when the second ``_``-separated field of its file name is ``val``; its
  object classes are read from ``<image>_seg.png`` as ``int(R / 10) * 256 + G``; an image whose
  sides both exceed 512 is resized so that its short side is 512 (long side
  ``round(long / short * 512)``; the image bilinearly, the class map by nearest neighbour, both
  with OpenCV); the 847 ADE ids of :data:`ADE847_IDS` become their trainIds 0..846, every other
  pixel 65535 (``ignore_label=65535`` in ``cat_seg/data/datasets/register_ade20k_847.py``). The
  image is written again (PIL, JPEG defaults) under ``images_detectron2/validation/`` and the
  labels under ``annotations_detectron2/validation/<stem>.tif``.
- Pascal Context-459 (``datasets/prepare_pascal_context_459.py``): for every id of
  ``VOC2010/pascalcontext_val.txt`` whose ``VOC2010/trainval/<id>.mat`` exists (the others are
  skipped), ``LabelMap - 1`` (LabelMap is 1..459 everywhere: the script asserts a minimum >= 0)
  is written to ``VOC2010/annotations_detectron2/pc459_val/<id>.tif``.

Each output is written atomically and only when it is missing or older than its source.
"""
import os
import pickle
from typing import List, Tuple

import numpy as np
from PIL import Image

from ..common.io import atomic_path
from .convert import PrepareError, _report

__all__ = ["ADE847_IDS", "ADE847_IGNORE", "CONTEXT459_IGNORE", "ADE847_MAX_SIZE", "ade847", "context459",
           "ade847_class_map", "ade847_labels", "context459_labels", "ade847_target_size"]

#: The ADE20K-full object ids of the 847 classes, in trainId order (cvlab-kaist/CAT-Seg @ 6d3a188
#: datasets/prepare_ade20k_full.py ``ADE20K_SEM_SEG_FULL_CATEGORIES``: entry i has trainId i).
ADE847_IDS = (
    2978, 312, 2420, 2855, 2131, 976, 447, 165, 2377, 838, 350, 1831, 1125, 3055, 401, 1610,
    1910, 2684, 471, 687, 774, 2473, 2264, 1735, 2994, 1564, 1276, 2178, 2329, 57, 907, 913,
    1395, 2138, 2272, 2128, 724, 155, 2053, 2380, 689, 1788, 3087, 2530, 581, 2388, 2985, 2454,
    2096, 137, 294, 212, 2185, 524, 2212, 943, 1869, 2251, 2793, 2423, 1121, 266, 1948, 1744,
    783, 571, 627, 629, 491, 1374, 223, 3016, 2598, 978, 239, 608, 236, 2531, 2616, 591,
    327, 2679, 1451, 181, 420, 2821, 1023, 855, 2733, 2928, 1240, 77, 1969, 2880, 14, 1936,
    2828, 631, 103, 3144, 308, 1282, 38, 1563, 29, 480, 2569, 247, 187, 778, 2243, 1941,
    2833, 120, 95, 2836, 1087, 868, 1401, 220, 47, 843, 123, 2537, 1927, 2337, 1702, 64,
    249, 642, 1981, 609, 2840, 2586, 1393, 2704, 1304, 146, 1494, 2739, 389, 1551, 131, 738,
    161, 747, 1919, 3109, 2179, 2989, 206, 1930, 1002, 2254, 1708, 2526, 160, 2901, 2262, 44,
    597, 2235, 1260, 682, 2151, 3107, 432, 1098, 2932, 461, 410, 2046, 533, 1481, 1858, 894,
    1322, 1891, 1756, 49, 1272, 1229, 2850, 1784, 2962, 259, 319, 954, 1974, 1013, 2356, 97,
    318, 592, 2885, 1017, 851, 1407, 1332, 303, 2714, 1924, 1346, 1081, 1583, 2727, 2509, 2123,
    602, 202, 10, 490, 530, 2213, 1884, 2934, 2687, 387, 2668, 982, 2547, 1474, 877, 1391,
    414, 698, 2019, 2422, 3010, 1139, 753, 1747, 2175, 1301, 1033, 1789, 2939, 2730, 1652, 90,
    1349, 2830, 1485, 2370, 2155, 118, 1402, 1957, 3130, 1197, 52, 2688, 96, 762, 772, 1857,
    2315, 1016, 643, 3105, 1849, 791, 349, 6, 3114, 1587, 1233, 559, 1223, 3049, 1943, 853,
    709, 1390, 2748, 2007, 1546, 1513, 2600, 2538, 1790, 194, 326, 2877, 594, 2036, 1662, 2366,
    1754, 418, 2553, 1951, 1963, 918, 2086, 997, 2731, 704, 1365, 569, 3108, 948, 839, 63,
    1305, 378, 2362, 2734, 2982, 2398, 1119, 382, 1141, 1805, 3102, 2341, 1131, 2316, 2626, 3104,
    198, 1896, 2800, 190, 3131, 1463, 357, 929, 209, 912, 1164, 1509, 2539, 3116, 2615, 1644,
    818, 242, 2217, 2347, 2686, 2300, 572, 789, 358, 2443, 101, 2969, 2692, 606, 2339, 1533,
    2060, 1782, 495, 371, 2707, 889, 3156, 2683, 1499, 1135, 1619, 125, 2838, 2792, 1695, 746,
    1343, 1370, 2858, 145, 2565, 1892, 1103, 286, 170, 3073, 922, 1655, 1602, 2160, 1151, 2176,
    2239, 132, 394, 1424, 607, 700, 116, 1425, 2676, 141, 2360, 2449, 897, 317, 2228, 2351,
    1543, 656, 1088, 373, 2472, 2892, 1740, 3067, 1367, 188, 79, 1633, 1885, 677, 1779, 1297,
    2334, 3027, 2735, 1791, 2405, 1748, 2983, 3035, 2824, 2168, 385, 2148, 2465, 175, 390, 268,
    2722, 2857, 3088, 2926, 2782, 1378, 1934, 2072, 2889, 944, 1158, 1383, 867, 2145, 1915, 361,
    402, 482, 2761, 300, 1554, 636, 260, 1186, 871, 2859, 2103, 208, 2236, 2012, 2462, 1462,
    2832, 2617, 1024, 1129, 18, 376, 134, 407, 434, 2017, 2717, 2005, 2993, 1545, 1445, 2831,
    1161, 2411, 2949, 1769, 552, 2327, 939, 3013, 1986, 1486, 2723, 1549, 2649, 1020, 392, 422,
    1419, 2099, 2464, 3058, 430, 675, 2941, 2955, 2355, 840, 32, 2338, 1232, 2834, 2991, 2879,
    444, 1657, 2246, 296, 245, 2661, 1202, 1714, 251, 1095, 1828, 311, 2732, 947, 2115, 2738,
    2525, 2194, 634, 740, 2682, 2020, 1156, 1036, 1295, 1181, 3037, 1614, 736, 893, 2047, 1274,
    1361, 3036, 2606, 2797, 2022, 2876, 2758, 472, 3028, 882, 1189, 743, 3122, 2401, 468, 1061,
    1523, 3059, 2843, 2853, 1529, 214, 3032, 3071, 277, 813, 426, 1039, 727, 1508, 2490, 2299,
    768, 1172, 537, 1847, 1664, 1110, 1014, 662, 121, 227, 2410, 2165, 2696, 3005, 1231, 635,
    292, 2690, 65, 2607, 2574, 1188, 456, 2913, 459, 1955, 827, 1111, 2412, 2997, 528, 366,
    1863, 500, 1001, 1958, 1441, 809, 210, 435, 718, 1674, 388, 1572, 1584, 1944, 674, 99,
    2352, 1019, 1763, 185, 554, 1066, 2508, 951, 2822, 415, 297, 1914, 2619, 1338, 2505, 955,
    2786, 238, 3000, 2763, 299, 822, 1288, 3101, 2894, 992, 489, 2157, 2309, 1576, 1810, 2964,
    2662, 2087, 1569, 503, 1505, 1468, 1613, 1138, 1256, 2715, 2846, 477, 2576, 108, 2245, 1162,
    2149, 2183, 858, 1324, 1055, 1741, 149, 615, 825, 2143, 304, 283, 2322, 3017, 2510, 1960,
    265, 2282, 2184, 1461, 3113, 2372, 2166, 232, 693, 1945, 3039, 2494, 1908, 2827, 280, 2950,
    1044, 288, 2863, 1342, 2409, 1258, 2249, 2862, 920, 1607, 2802, 610, 3129, 1108, 2823, 476,
    2641, 2788, 2070, 1368, 2903, 699, 2844, 942, 2663, 457, 2701, 2540, 2231, 2746, 1738, 2350,
    2808, 2025, 2541, 2156, 126, 2512, 831, 2503, 2039, 2774, 886, 919, 2240, 2636, 963, 1218,
    1406, 1420, 526, 2639, 975, 1921, 2305, 1193, 2517, 2809, 1647, 314, 2560, 545, 1345, 775,
    603, 1163, 1641, 1678, 2450, 2915, 42, 2242, 2741, 1143, 862, 1654, 1826, 1689, 3124, 2710,
    152, 549, 360, 1982, 1478, 2203, 2612, 2956, 2681, 437, 2171, 1933, 3110, 1824, 2803, 234,
    764, 177, 817, 3145, 1262, 864, 2359, 2992, 1725, 2667, 2484, 1133, 1667, 2847, 932, 1392,
    2573, 2140, 1046, 264, 2927, 2752, 679, 2493, 1658, 2466, 1057, 2444, 2093, 2248, 2432, 726,
    816, 1171, 2766, 2900, 2313, 488, 2265, 2043, 332, 1771, 2320, 2646, 1089, 2826, 3148,)
#: Pixels of no listed class (CAT-Seg @ 6d3a188 prepare_ade20k_full.py ``np.zeros_like(lab,
#: dtype=np.uint16) + 65535``; register_ade20k_847.py ``ignore_label=65535``).
ADE847_IGNORE = 65535
#: The ignore label the project registers for Context-459's masks. CAT-Seg @ 6d3a188
#: (cat_seg/data/datasets/register_pascal_context.py) registers 459, MESS (blumenstiel/MESS
#: cc701b5) 65535, for the same files. No prepared mask holds either value (every pixel is
#: ``LabelMap - 1`` in 0..458), so the metrics are the same; 65535 is the one that can never be
#: a class index of a uint16 mask, and the value ADE-847 uses.
CONTEXT459_IGNORE = 65535
#: prepare_ade20k_full.py ``max_size = 512``: the short side after resizing.
ADE847_MAX_SIZE = 512

_ADE_ID_TO_TRAIN = {ade_id: train_id for train_id, ade_id in enumerate(ADE847_IDS)}


def ade847_target_size(height: int, width: int, max_size: int = ADE847_MAX_SIZE):
    """``(height, width)`` after CAT-Seg's resize, or None when the image is kept: only when both
    sides exceed ``max_size``, the short side becomes ``max_size`` and the long one
    ``round(long / short * max_size)`` (Python's round)."""
    if width >= height > max_size:
        return max_size, round(width / float(height) * max_size)
    if height >= width > max_size:
        return round(height / float(width) * max_size), max_size
    return None


def ade847_class_map(seg_rgb: np.ndarray) -> np.ndarray:
    """ADE20K's object-class map of a ``_seg.png`` (``(H, W, 3)`` uint8): ``int(R / 10) * 256 + G``
    as int32."""
    if seg_rgb.ndim != 3 or seg_rgb.shape[2] < 2:
        raise ValueError(f"expected an (H, W, 3) RGB _seg.png, got shape {seg_rgb.shape}")
    r = seg_rgb[:, :, 0]
    g = seg_rgb[:, :, 1]
    return (r // 10).astype(np.int32) * 256 + g.astype(np.int32)


def ade847_labels(class_map: np.ndarray) -> np.ndarray:
    """The uint16 trainIds of an ADE class map: the 847 ids of :data:`ADE847_IDS` -> 0..846,
    every other value :data:`ADE847_IGNORE`."""
    out = np.full(class_map.shape, ADE847_IGNORE, dtype=np.uint16)
    for value in np.unique(class_map):
        train_id = _ADE_ID_TO_TRAIN.get(int(value))
        if train_id is not None:
            out[class_map == value] = train_id
    return out


def _validation_entries(root: str) -> List[Tuple[str, str]]:
    index_file = os.path.join(root, "ADE20K_2021_17_01", "index_ade20k.pkl")
    if not os.path.isfile(index_file):
        raise PrepareError(f"missing {index_file}: download ADE20K_2021_17_01.zip (ADE20K full, "
                           "https://groups.csail.mit.edu/vision/datasets/ADE20K/request_data/) and extract it under "
                           f"{root}/ (docs/datasets.md)")
    try:
        with open(index_file, "rb") as f:
            index = pickle.load(f)
        folders, files = list(index["folder"]), list(index["filename"])
    except Exception as e:
        raise PrepareError(f"cannot read {index_file} as ADE20K's index (a pickled dict with 'folder' and "
                           f"'filename' lists): {type(e).__name__}: {e}")
    if len(folders) != len(files):
        raise PrepareError(f"{index_file}: 'folder' has {len(folders)} entries but 'filename' {len(files)}")
    # prepare_ade20k_full.py: split = "validation" if file_name.split("_")[1] == "val"
    return [(folder, name) for folder, name in zip(folders, files)
            if len(name.split("_")) > 1 and name.split("_")[1] == "val"]


def ade847(root: str) -> None:
    """ADE20K 2021 validation -> ``ADE20K_2021_17_01/{images,annotations}_detectron2/validation``."""
    import cv2

    entries = _validation_entries(root)
    if not entries:
        raise PrepareError(f"{os.path.join(root, 'ADE20K_2021_17_01', 'index_ade20k.pkl')} lists no validation "
                           "image (a file name whose second '_' field is 'val', e.g. ADE_val_00000001.jpg)")
    base = os.path.join(root, "ADE20K_2021_17_01")
    image_dir = os.path.join(base, "images_detectron2", "validation")
    label_dir = os.path.join(base, "annotations_detectron2", "validation")
    os.makedirs(image_dir, exist_ok=True)
    os.makedirs(label_dir, exist_ok=True)
    written = fresh = 0
    for folder, name in entries:
        src = os.path.join(root, folder, name)
        seg = src.replace(".jpg", "_seg.png")  # prepare_ade20k_full.py loadAde20K
        for path in (src, seg):
            if not os.path.isfile(path):
                raise PrepareError(f"{path} (listed in index_ade20k.pkl) does not exist: is --root the folder that "
                                   "holds ADE20K_2021_17_01/?")
        out_img = os.path.join(image_dir, name)
        out_lab = os.path.join(label_dir, os.path.splitext(name)[0] + ".tif")
        newest = max(os.stat(src).st_mtime_ns, os.stat(seg).st_mtime_ns)
        if all(os.path.isfile(p) and os.stat(p).st_mtime_ns >= newest for p in (out_img, out_lab)):
            fresh += 1
            continue
        try:
            with Image.open(src) as im:
                img = np.asarray(im)
            with Image.open(seg) as im:
                class_map = ade847_class_map(np.asarray(im.convert("RGB")) if im.mode != "RGB" else np.asarray(im))
        except (OSError, ValueError) as e:
            raise PrepareError(f"cannot read {src} / {seg}: {e}")
        if img.dtype != np.uint8 or img.shape[:2] != class_map.shape:
            raise PrepareError(f"{src} ({img.dtype}, {img.shape[:2]}) and {seg} ({class_map.shape}) are not an 8-bit "
                               "image and its class map of the same size")
        size = ade847_target_size(*img.shape[:2])
        if size is not None:
            h_new, w_new = size
            img = cv2.resize(img, (w_new, h_new), interpolation=cv2.INTER_LINEAR)
            class_map = cv2.resize(class_map, (w_new, h_new), interpolation=cv2.INTER_NEAREST)
        labels = ade847_labels(class_map)
        with atomic_path(out_img) as tmp:
            Image.fromarray(img).save(tmp, format="JPEG")
        with atomic_path(out_lab) as tmp:
            Image.fromarray(labels).save(tmp, format="TIFF")
        written += 1
    _report(written, fresh, "ADE20K-847 images and uint16 TIFF labels", os.path.dirname(label_dir))


def context459_labels(label_map: np.ndarray, source: str = "LabelMap") -> np.ndarray:
    """``LabelMap - 1`` as uint16, refusing a LabelMap value outside 1..459 (``source`` named)."""
    label_map = np.asarray(label_map)
    if label_map.ndim != 2:
        raise PrepareError(f"{source}: LabelMap has shape {label_map.shape}; expected (H, W)")
    if label_map.size and (label_map.min() < 1 or label_map.max() > 459):
        raise PrepareError(f"{source}: LabelMap holds values {int(label_map.min())}..{int(label_map.max())}; "
                           "expected 1..459 (CAT-Seg's prepare_pascal_context_459.py asserts LabelMap - 1 >= 0)")
    return (label_map.astype(np.int64) - 1).astype(np.uint16)


def context459(root: str) -> None:
    """``VOC2010/trainval/<id>.mat`` of ``pascalcontext_val.txt`` -> ``annotations_detectron2/pc459_val``."""
    import scipy.io

    from ..data.datasets.segmentation import CONVERTED_GT
    from ..data.ground_truth import is_up_to_date

    base = os.path.join(root, "VOCdevkit", "VOC2010")
    split_file = os.path.join(base, "pascalcontext_val.txt")
    if not os.path.isfile(split_file):
        raise PrepareError(f"missing {split_file}: copy datasets/pascalcontext_val.txt of "
                           "https://github.com/cvlab-kaist/CAT-Seg there (its list of the Pascal Context val ids)")
    with open(split_file) as f:
        ids = [line.strip() for line in f if line.strip()]
    mat_dir = os.path.join(base, "trainval")
    if not os.path.isdir(mat_dir):
        raise PrepareError(f"missing {mat_dir}: download trainval.tar.gz (https://roozbehm.info/pascal-context/) and "
                           f"extract it in {base}/")
    out_dir = os.path.join(base, CONVERTED_GT, "pc459_val")
    os.makedirs(out_dir, exist_ok=True)
    written = fresh = skipped = 0
    for image_id in ids:
        src = os.path.join(mat_dir, image_id + ".mat")
        dst = os.path.join(out_dir, image_id + ".tif")
        if not os.path.isfile(src):  # prepare_pascal_context_459.py: `if osp.exists(ori_mask)`
            skipped += 1
            continue
        if is_up_to_date(src, dst):
            fresh += 1
            continue
        try:
            label_map = scipy.io.loadmat(src)["LabelMap"]
        except Exception as e:
            raise PrepareError(f"cannot read LabelMap from {src}: {type(e).__name__}: {e}")
        labels = context459_labels(label_map, src)
        with atomic_path(dst) as tmp:
            Image.fromarray(labels).save(tmp, format="TIFF")
        written += 1
    _report(written, fresh, "Pascal Context-459 uint16 TIFF labels", out_dir)
    if skipped:
        print(f"{skipped} of {len(ids)} ids of {split_file} have no .mat in {mat_dir} and were skipped (as CAT-Seg's "
              "prepare_pascal_context_459.py does)")
    if written + fresh == 0:
        raise PrepareError(f"none of the {len(ids)} ids of {split_file} has a .mat file in {mat_dir}")
