"""Config defaults of sparseclip_d2 (detectron2 ``CfgNode``).

Call :func:`add_sparseclip_config` on a detectron2 default config before merging
a sparseclip_d2 YAML file::

    from detectron2.config import get_cfg
    from sparseclip_d2 import add_sparseclip_config
    cfg = get_cfg(); add_sparseclip_config(cfg); cfg.merge_from_file("configs/entmax_qq_l14.yaml")

Every key has a comment; the method is training-free, so there are no solver keys. The
sections of the parts with a settings dataclass (PROXY and its FSA / CASS / TRIDENT / CORRCLIP,
OBJECT_PRESENCE, LABEL_PROPAGATION and its VFM, FEEDBACK, CLUSTER_VOTE) are built from that
dataclass, whose fields carry their keys and comments (``sparseclip_d2/common/keys.py``), so each
default is written once.
"""
import ast
import logging
import math
import os

from . import require_detectron2
from .common.keys import check_number

require_detectron2("sparseclip_d2.config")

from detectron2.config import CfgNode as CN

from .common.keys import build_section

__all__ = ["add_sparseclip_config", "check_sparseclip_config", "merge_config"]

logger = logging.getLogger(__name__)
_WARNED = set()  # config warnings already logged in this process (one line each)


def add_sparseclip_config(cfg):
    """Add the ``MODEL.SPARSECLIP``, ``TEST.SLIDING_WINDOW`` and related keys to ``cfg`` in place,
    and register sparseclip_d2's detectron2 parts (META_ARCHs, backbone, datasets, loaders,
    evaluators; :func:`sparseclip_d2.register_detectron2_parts`, idempotent)."""
    from . import register_detectron2_parts

    register_detectron2_parts()
    from .dense.first_segmentation import FEEDBACK_SECTION
    _C = cfg
    _C.MODEL.SPARSECLIP = CN()
    # The CLIP model.
    _C.MODEL.SPARSECLIP.CLIP = CN()
    # open_clip model name. OpenAI weights were trained with QuickGELU: use the
    # "-quickgelu" names (ViT-B-16-quickgelu, ViT-L-14-quickgelu).
    _C.MODEL.SPARSECLIP.CLIP.NAME = "ViT-B-16-quickgelu"
    # open_clip pretrained tag ("openai"), a local checkpoint file, or "none" for
    # random weights (a smoke run whose numbers mean nothing; logged loudly).
    _C.MODEL.SPARSECLIP.CLIP.PRETRAINED = "openai"
    # Force QuickGELU even when NAME lacks the "-quickgelu" suffix.
    _C.MODEL.SPARSECLIP.CLIP.FORCE_QUICK_GELU = False
    # Model weights dtype: "fp32", "fp16" or "bf16". Attention scores and
    # normalisers are always computed in float32.
    _C.MODEL.SPARSECLIP.CLIP.PRECISION = "fp32"
    # Directory where open_clip caches downloaded weights ("" = open_clip default).
    _C.MODEL.SPARSECLIP.CLIP.CACHE_DIR = ""
    # How position embeddings are resized to another patch grid (bicubic): "size"
    # (F.interpolate(size=(h, w)), as MMSeg/MaskCLIP) or "scale_factor"
    # (F.interpolate(scale_factor=((h + 0.1) / side, (w + 0.1) / side)), as SCLIP/ClearCLIP/
    # NACLIP's interpolate_pos_encoding). Equal at the native grid (224 px crops).
    # Also "size_antialias" (bicubic by size, antialias=True: GEM's resample_abs_pos_embed) and
    # "bilinear" (CLIP Surgery's VisionTransformer.forward).
    _C.MODEL.SPARSECLIP.CLIP.POS_EMBED_INTERP = "size"
    # Activation of the vision tower's MLPs: "" (as built from NAME/PRETRAINED), "gelu" or
    # "quick_gelu". MaskCLIP's official ViT-B/16 runs the OpenAI weights with GELU
    # (chongzhou96/MaskCLIP configs/_base_/models/maskclip_vit16.py, act_cfg). The text
    # tower is never changed.
    _C.MODEL.SPARSECLIP.CLIP.VISION_ACT = ""
    # LayerNorm eps of the vision tower (0 = as built, 1e-5 for CLIP). MaskCLIP: 1e-6
    # (maskclip_vit16.py, norm_cfg). The text tower is never changed.
    _C.MODEL.SPARSECLIP.CLIP.VISION_LN_EPS = 0.0
    # Per-patch path through an attention-pooling (MAP) head (SigLIP, PE-Core), see
    # docs/architecture.md: "value" (each patch's value vector through the head's output
    # projection and residual MLP) or "value_no_mlp" (without the head's MLP).
    # Ignored by towers pooled with a class token or an average.
    _C.MODEL.SPARSECLIP.CLIP.ATTN_POOL_DENSE = "value"

    # The modified attention of the final block(s) (see sparseclip_d2.clip.AttentionSpec).
    _C.MODEL.SPARSECLIP.ATTENTION = CN()
    # Score source of the last block: qk, qq, kk, vv, identity, or sums like qq+kk.
    _C.MODEL.SPARSECLIP.ATTENTION.SOURCE = "qk"
    # Row normaliser of the last NUM_LAYERS blocks: softmax, entmax, sparsemax, random_matched.
    _C.MODEL.SPARSECLIP.ATTENTION.NORMALIZER = "softmax"
    # alpha of alpha-entmax, in [1, 2] (1 = softmax, 1.5 = entmax15, 2 = sparsemax).
    # Also the reference sparsity of the random_matched control.
    _C.MODEL.SPARSECLIP.ATTENTION.ALPHA = 1.2
    # Scores are divided by this temperature before normalising (paper control: 0.5).
    _C.MODEL.SPARSECLIP.ATTENTION.TEMPERATURE = 1.0
    # Number of final blocks whose softmax is replaced by NORMALIZER (and whose scores are
    # divided by TEMPERATURE); paper: 1..5, its depth study varies where entmax applies.
    # SOURCE, PRIOR, SUM_MODE and BLOCK.* act on the last block only: the earlier blocks keep
    # QK^T scores and their residual + FFN. So with softmax at TEMPERATURE 1, NUM_LAYERS > 1
    # changes nothing (a logged warning; an error in spec strings such as "qq+kk:layers=2").
    _C.MODEL.SPARSECLIP.ATTENTION.NUM_LAYERS = 1
    # Additive score prior of the last block: "none" or "gaussian" (NACLIP).
    _C.MODEL.SPARSECLIP.ATTENTION.PRIOR = "none"
    # Standard deviation of the gaussian prior, in patches (NACLIP: 5).
    _C.MODEL.SPARSECLIP.ATTENTION.PRIOR_STD = 5.0
    # How sum sources (qq+kk) combine: "normalize_then_sum" (SCLIP, rows sum to the
    # number of terms) or "sum_then_normalize".
    _C.MODEL.SPARSECLIP.ATTENTION.SUM_MODE = "normalize_then_sum"
    # Seed of the random_matched control's generator.
    _C.MODEL.SPARSECLIP.ATTENTION.SEED = 0
    # How the blocks before the modified ones compute their attention (AttentionSpec.unmodified_blocks):
    # "sdpa" as nn.MultiheadAttention outside its fused path (OpenAI CLIP's sequence-first blocks, the
    # upstream code of SCLIP, NACLIP, ClearCLIP, ...); "explicit": softmax((q d^-1/2) k^T), then x v
    # (ResCLIP's custom_attn for its blocks before the last). Equal up to float rounding.
    _C.MODEL.SPARSECLIP.ATTENTION.UNMODIFIED_BLOCKS = "sdpa"
    # Attention mixed across layers (ITACLIP, ResCLIP's RCS; AttentionSpec.mix_*): the last
    # block's weights W become SCALE * ((1 - WEIGHT) * W + WEIGHT * mean_l W_l), W_l computed
    # with SOURCE and NORMALIZER from the input of block l (0-based index) in the same forward.
    _C.MODEL.SPARSECLIP.ATTENTION.MIX = CN()
    # 0-based indices of the tapped blocks, each < depth - 1; [] disables the mixing.
    _C.MODEL.SPARSECLIP.ATTENTION.MIX.LAYERS = []
    # Score source of the tapped layers (qk = their own attention; ITACLIP: qq+kk).
    _C.MODEL.SPARSECLIP.ATTENTION.MIX.SOURCE = "qk"
    # Normaliser of the tapped layers; "" = ATTENTION.NORMALIZER (one override reaches all).
    _C.MODEL.SPARSECLIP.ATTENTION.MIX.NORMALIZER = ""
    # Share of the tapped layers' mean, in [0, 1] (ResCLIP's lambda, ITACLIP 0.5).
    _C.MODEL.SPARSECLIP.ATTENTION.MIX.WEIGHT = 0.5
    # Factor on the blend, > 0 (ResCLIP's tau; ITACLIP 1).
    _C.MODEL.SPARSECLIP.ATTENTION.MIX.SCALE = 1.0
    # Options of the "procrustes" score source (AttentionSpec.procrustes; attention/procrustes.py):
    # scores q (k R)^T d^-0.5 + KK_WEIGHT k_c k_c^T d^-0.5, R the orthogonal polar factor of
    # k_c^T q_c (q_c, k_c centred by ||q||-weighted means, the CLS token weighted 0).
    _C.MODEL.SPARSECLIP.ATTENTION.PROCRUSTES = CN()
    # Weight of the centred key term; 0 = none (PGSmall/PEARL @ c26062b pearl_ovss.py: alpha_kk=0.08).
    _C.MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.KK_WEIGHT = 0.0
    # How the polar factor is computed: "newton_schulz" (pearl/attn.py align_solver='polar') or "svd".
    _C.MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.SOLVER = "newton_schulz"
    # Coupled Newton-Schulz steps (pearl/attn.py polar_iters=5).
    _C.MODEL.SPARSECLIP.ATTENTION.PROCRUSTES.ITERATIONS = 5

    # The last block's structure.
    _C.MODEL.SPARSECLIP.BLOCK = CN()
    # Keep the residual connection around the last attention (ClearCLIP/NACLIP: False).
    _C.MODEL.SPARSECLIP.BLOCK.RESIDUAL = True
    # Keep the last block's FFN (MLP) branch (ClearCLIP/NACLIP: False).
    _C.MODEL.SPARSECLIP.BLOCK.FFN = True
    # CLS-token residual weight: this times the last block's input CLS token is added to every
    # output token of the last block (SC-CLIP's res_cls 0.3); 0 disables.
    _C.MODEL.SPARSECLIP.BLOCK.CLS_WEIGHT = 0.0
    # Cosine scores (GEM; AttentionSpec.qkv_norm): "none" (scaled dot products) or "l2"
    # (cosine similarities of the L2-normalised q / k / v times an inverse temperature);
    # "l2" runs on the parallel path only (PARALLEL.LAYERS > 0).
    _C.MODEL.SPARSECLIP.ATTENTION.QKV_NORM = "none"
    # Inverse temperature of "l2" scores: 0 = GEM's adaptive mean ||ln_1(x)|| * d^-0.5 per
    # image; > 0 a fixed value (GEM's ss_attn_temp).
    _C.MODEL.SPARSECLIP.ATTENTION.COSINE_SCALE = 0.0
    # GEM's self-self iteration loop count (ss_attn_iter) for "l2" self terms (qq, kk, vv).
    _C.MODEL.SPARSECLIP.ATTENTION.SELF_ITERATIONS = 0
    # Parallel path (GEM, CLIP Surgery; sparseclip_d2/clip/parallel.py): over the last LAYERS
    # blocks a branch reads each block's normed main-stream input, applies the ATTENTION.*
    # attention and keeps its residual / FFN per BLOCK.RESIDUAL / BLOCK.FFN; the main stream
    # runs unchanged. 0 disables.
    _C.MODEL.SPARSECLIP.PARALLEL = CN()
    _C.MODEL.SPARSECLIP.PARALLEL.LAYERS = 0
    # Where the output CLS token comes from: "parallel" (the branch, GEM) or "main" (CLIP Surgery).
    _C.MODEL.SPARSECLIP.PARALLEL.CLS = "parallel"
    # CLIP Surgery's text-side feature surgery (sparseclip_d2/methods/clip_surgery/surgery.py), usable with any
    # method: logits = LOGIT_SCALE * (w_n cos_n - mean_m w_m cos_m), w = p / mean(p),
    # p = softmax(CLS_SCALE * cos(CLS embedding, texts)) per window.
    _C.MODEL.SPARSECLIP.FEATURE_SURGERY = CN()
    _C.MODEL.SPARSECLIP.FEATURE_SURGERY.ENABLED = False
    # xmed-lab/CLIP_Surgery @ d4696d4 clip/clip.py clip_feature_surgery(t=2): (prob * 2).softmax(-1)
    _C.MODEL.SPARSECLIP.FEATURE_SURGERY.CLS_SCALE = 2.0

    # The text classifier.
    _C.MODEL.SPARSECLIP.TEXT = CN()
    # Prompt templates: "single" ("a photo of a {}."), "openai_imagenet" (80 templates),
    # or the path of a text file with one template per line containing "{}".
    _C.MODEL.SPARSECLIP.TEXT.TEMPLATES = "single"
    # On-disk cache of class embeddings ("" = ~/.cache/sparseclip_d2/text; "off" disables).
    _C.MODEL.SPARSECLIP.TEXT.CACHE_DIR = ""
    # Prompts encoded per text-encoder batch.
    _C.MODEL.SPARSECLIP.TEXT.BATCH_SIZE = 256
    # Tokenizer: "" = the model's own (open_clip.get_tokenizer: CLIP BPE, or a Hugging Face
    # tokenizer for SigLIP / SigLIP 2, which needs `transformers` and its files), or a local
    # directory with that Hugging Face tokenizer's files (offline machines).
    _C.MODEL.SPARSECLIP.TEXT.TOKENIZER = ""
    # Class definitions mixed into the class embeddings (ITACLIP's text expansion,
    # sparseclip_d2.clip.definitions): "" = none, or a file with one "name >=definition" line
    # per class (background excluded), ITACLIP's llama_generated_texts/ format; the project
    # ships none. Each synonym embedding e becomes (1 - W) e + W d(its class).
    _C.MODEL.SPARSECLIP.TEXT.DEFINITIONS = ""
    _C.MODEL.SPARSECLIP.TEXT.DEFINITION_WEIGHT = 0.0

    # Class-name set: "" (each dataset's packaged names, with synonyms) or an upstream
    # baseline's published vocabulary for the same dataset: "sclip", "clearclip", "naclip",
    # "maskclip" (shipped under sparseclip_d2/data/classnames/<set>/, sources in SOURCES.md).
    _C.MODEL.SPARSECLIP.CLASS_NAMES = ""
    # Pixel normalisation: "clip" (the CLIP model's own mean/std), "clip_mmseg" (the rounded
    # CLIP values mean [122.771, 116.746, 104.094], std [68.501, 66.632, 70.323] of the
    # SCLIP/ClearCLIP/NACLIP segmentors' SegDataPreProcessor) or "imagenet" (mean
    # [123.675, 116.28, 103.53], std [58.395, 57.12, 57.375], MaskCLIP's img_norm_cfg).
    _C.MODEL.SPARSECLIP.PIXEL_NORM = "clip"
    # Windows (or whole images) whose sides are not multiples of the patch size:
    # "pad_crop" (zero-pad symmetrically after normalisation, crop the upsampled logits
    # back; ClearCLIP's compute_padsize), "truncate" (the patch convolution drops the
    # remainder rows/columns and the patch logits are stretched over the whole window;
    # SCLIP/NACLIP with OpenAI CLIP) or "pad_corner" (zero-pad bottom/right, logits of the
    # padded grid stretched over the unpadded window; MaskCLIP's mmseg PatchEmbed 'corner').
    _C.MODEL.SPARSECLIP.PATCH_REMAINDER = "pad_crop"
    # PAMR refinement of the logits at the output size (post-processing, any config):
    # STEPS = 0 disables; NACLIP: 10 steps, dilations [8, 16] (sinahmr/NACLIP naclip.py).
    _C.MODEL.SPARSECLIP.PAMR = CN()
    _C.MODEL.SPARSECLIP.PAMR.STEPS = 0
    _C.MODEL.SPARSECLIP.PAMR.DILATIONS = [8, 16]
    # Morphological closing of the label map (ITACLIP: 3, a 3x3 rectangle on the uint8 labels);
    # 0 disables. When on, the model returns "sem_seg_labels" instead of "sem_seg" scores.
    _C.MODEL.SPARSECLIP.LABEL_CLOSING = 0

    # Logits = LOGIT_SCALE * cosine(patch, class). Paper: unknown; SCLIP 40, ClearCLIP 50.
    # 0 = the model's own learned scale exp(logit_scale) (SigLIP's sigmoid bias is a shift
    # shared by all classes and cancels in the softmax over classes).
    _C.MODEL.SPARSECLIP.LOGIT_SCALE = 50.0
    # Background rule: pixels whose max class probability is below this become the
    # background class (index 0) of datasets that have one. 0 disables.
    _C.MODEL.SPARSECLIP.PROB_THRESHOLD = 0.0
    # SCLIP's area rule: classes covering less than this fraction of the image's
    # pixels in the prediction are suppressed. 0 disables.
    _C.MODEL.SPARSECLIP.AREA_THRESHOLD = 0.0

    # Semantic feedback (ResCLIP's SFR; sparseclip_d2.attention.feedback): the last block runs
    # twice, the first pass's segmentation of each window giving a prior P blended into the
    # second pass's scores as SCALE * ((1 - WEIGHT) S + WEIGHT P / max P). Segmentation-only.
    # Keys and comments: FeedbackSettings and FEEDBACK_SECTION (sparseclip_d2/dense/first_segmentation.py).
    _C.MODEL.SPARSECLIP.FEEDBACK = build_section(CN, FEEDBACK_SECTION)

    # The calibrated last block (SC-CLIP, SFP; sparseclip_d2/clip/calibrated.py, any source and
    # normaliser): on when OUTLIER_DETECTOR is not "none", a SIMILARITY_LAYER or
    # POST_SIMILARITY_LAYER is >= 0 or FUSION_LAYERS is not empty. The last block then runs on
    # the patch tokens alone (no residual/FFN per BLOCK.*, + BLOCK.CLS_WEIGHT x CLS). Tap indices
    # count block inputs from 0: tap i = the output of layer i counted from 1 (SC-CLIP's layer 9
    # = 9). Needs ATTENTION.NUM_LAYERS 1, no MIX.LAYERS, PARALLEL.LAYERS 0, FEEDBACK off.
    _C.MODEL.SPARSECLIP.CALIBRATION = CN()
    # Outlier patch tokens of the last block's input (and of SIMILARITY_LAYER's tokens), each
    # replaced by the mean of its inlier 3x3 neighbours: "none" or "lof" (SC-CLIP's local
    # outlier factor with NEIGHBORS nearest tokens, tokens above the 1 - CONTAMINATION quantile),
    # "l2" or "som" (SFP, below).
    _C.MODEL.SPARSECLIP.CALIBRATION.OUTLIER_DETECTOR = "none"
    _C.MODEL.SPARSECLIP.CALIBRATION.OUTLIER_NEIGHBORS = 30
    _C.MODEL.SPARSECLIP.CALIBRATION.OUTLIER_CONTAMINATION = 0.05
    # Tap whose (repaired) patch cosine similarity S aggregates the last block's input (entries
    # below SIMILARITY_THRESHOLD set to 0, rows normalised) and joins its attention as the term
    # (S - mean S) * SIMILARITY_SCALE, negatives -inf, normalised by ATTENTION.NORMALIZER and
    # combined with the SOURCE terms by ATTENTION.SUM_MODE; -1 = off.
    _C.MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_LAYER = -1
    _C.MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_SCALE = 3.0
    _C.MODEL.SPARSECLIP.CALIBRATION.SIMILARITY_THRESHOLD = 0.4
    # Tap whose patch similarity (thresholded the same way) aggregates the last block's output
    # (and the fusion branch's); -1 = off.
    _C.MODEL.SPARSECLIP.CALIBRATION.POST_SIMILARITY_LAYER = -1
    # Taps summed (prefix tokens included) and run through the last block again, the result
    # added to its output (multi-level fusion); [] = off.
    _C.MODEL.SPARSECLIP.CALIBRATION.FUSION_LAYERS = []
    # SFP's detectors: "l2" (the OUTLIER_COUNT tokens of largest norm) and "som" (patches whose
    # CLS attention in the block before the last, its CLS row x OUTLIER_CLS_SCALE, exceeds their
    # self-attention; at most OUTLIER_COUNT). SFP: 10 and 0.3 x 5.0 = 1.5.
    _C.MODEL.SPARSECLIP.CALIBRATION.OUTLIER_COUNT = 10
    _C.MODEL.SPARSECLIP.CALIBRATION.OUTLIER_CLS_SCALE = 1.5
    # How the fusion branch attends: "last" (the last block's weights, SC-CLIP) or "similarity"
    # (the normalised SIMILARITY_LAYER term alone, SFP's sinkhorn_attn).
    _C.MODEL.SPARSECLIP.CALIBRATION.FUSION_ATTENTION = "last"
    # The attention term (and the "similarity" fusion attention) reads S with its entries below
    # SIMILARITY_THRESHOLD set to 0 (SFP thresholds pre_sim in place before custom_attn) instead
    # of the unthresholded S (SC-CLIP's mid_simi copy).
    _C.MODEL.SPARSECLIP.CALIBRATION.THRESHOLD_SIMILARITY_TERM = False

    # FG-OVD region retrieval (META_ARCHITECTURE "SparseCLIPFGOVD").
    _C.MODEL.SPARSECLIP.FGOVD = CN()
    # "dense": RoIAlign on the modified dense features; "crop": encode each box crop
    # with the unmodified image encoder after CLIP's own preprocessing (baseline protocol
    # of lorebianchi98/FG-CLIP fgovd_evaluation/inference_on_benchmark.py).
    _C.MODEL.SPARSECLIP.FGOVD.PROTOCOL = "dense"
    # Dense protocol working resolution: the whole image is resized to RESOLUTION x RESOLUTION.
    _C.MODEL.SPARSECLIP.FGOVD.RESOLUTION = 224
    # RoIAlign output size (pooled then averaged) and aligned flag.
    _C.MODEL.SPARSECLIP.FGOVD.POOLER_RESOLUTION = 1
    _C.MODEL.SPARSECLIP.FGOVD.ALIGNED = True
    # Caption templates ("none" = caption text as is).
    _C.MODEL.SPARSECLIP.FGOVD.TEMPLATES = "none"
    # Negatives per box; -1 = the split's default (10; pattern 7; transparency 2).
    _C.MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES = -1
    # With proposals: the IoU a proposal needs to stand for a ground-truth box.
    _C.MODEL.SPARSECLIP.FGOVD.IOU_THRESHOLD = 0.5
    # Caption embeddings kept per model (least recently used dropped beyond this).
    _C.MODEL.SPARSECLIP.FGOVD.CAPTION_CACHE_SIZE = 8192
    # Named set of evaluation conventions (sparseclip_d2.modeling.fgovd_conventions):
    #   "fgovd": the official FG-OVD rank evaluation (lorebianchi98/FG-OVD evaluation/ranks.py);
    #   "region_top1": the dense RoIAlign top-1 protocol (360CVGroup/FG-CLIP
    #   fgclip/eval/fgovd_eval.py), under which the paper's FG-OVD numbers are compared.
    # Each of the five keys below overrides one convention of the preset; "" = the preset's.
    _C.MODEL.SPARSECLIP.FGOVD.CONVENTIONS = "region_top1"
    # Boxes with fewer than N negatives: "drop" (FG-OVD ranks.py keeps annotations with
    # len(neg_category_ids) >= n_neg) or "keep" (ranked among the negatives they have;
    # 360CVGroup fgovd_eval.py scores every box).
    _C.MODEL.SPARSECLIP.FGOVD.MIN_NEGATIVES = ""
    # A negative scoring exactly as the positive: "miss" (FG-OVD ranks.py counts scores
    # >= the positive) or "hit" (360CVGroup fgovd_eval.py: torch.equal(max, positive)).
    _C.MODEL.SPARSECLIP.FGOVD.TIES = ""
    # Median rank: "fgovd" sorted(r)[len(r) // 2 + 1] (FG-OVD evaluation/ranks.py
    # get_median_rank), "fgclip" sorted(r)[len(r) // 2] (lorebianchi98/FG-CLIP
    # src/eval_util.py get_ranks), "mean" (mean of the two middle ranks for an even count).
    _C.MODEL.SPARSECLIP.FGOVD.MEDIAN = ""
    # Dense protocol whole-image resize: "bicubic" (PIL's default of Image.resize, used by
    # 360CVGroup fgovd_eval.py) or "bilinear".
    _C.MODEL.SPARSECLIP.FGOVD.RESIZE_INTERPOLATION = ""
    # Proposal standing for a ground-truth box: "score" (highest-scoring proposal with IoU >
    # IOU_THRESHOLD, FG-OVD evaluation/ranks.py through NMS with the box) or "iou" (highest
    # IoU, IoU >= IOU_THRESHOLD).
    _C.MODEL.SPARSECLIP.FGOVD.PROPOSAL_MATCHING = ""

    # How test images are resized to INPUT.MIN_SIZE_TEST (short side) with
    # INPUT.MAX_SIZE_TEST (long side): "detectron2" (ResizeShortestEdge: PIL bilinear with
    # antialiasing; the long side is capped) or "mmseg" (MMSeg Resize(scale=(MAX, MIN),
    # keep_ratio=True) = mmcv.imrescale: scale = min(MAX / long, MIN / short), new side
    # int(side * scale + 0.5), cv2.resize INTER_LINEAR without antialiasing). MMSeg's
    # (2048, 336) is MIN 336 / MAX 2048; MaskCLIP's Context59 (520, 520) is MIN 520 / MAX 520.
    _C.INPUT.RESIZE_MODE = "detectron2"

    # Sliding-window inference (MMSeg "slide" mode).
    _C.TEST.SLIDING_WINDOW = CN()
    _C.TEST.SLIDING_WINDOW.ENABLED = False
    # Square crop size and stride in pixels of the resized image.
    _C.TEST.SLIDING_WINDOW.CROP_SIZE = 448
    _C.TEST.SLIDING_WINDOW.STRIDE = 224
    # Windows encoded together per encoder call.
    _C.TEST.SLIDING_WINDOW.BATCH_SIZE = 8

    # Test-time augmentation of each window's logits (sparseclip_d2.methods.itaclip.tta): "" = none,
    # "itaclip" = ITACLIP's image engineering (original + grayscale + blur features averaged,
    # mixed with the flipped windows' logits: WEIGHT * L + (1 - WEIGHT) * L_flip).
    _C.TEST.TTA = CN()
    _C.TEST.TTA.MODE = ""
    _C.TEST.TTA.WEIGHT = 0.75

    # Attention statistics (same-class / non-class mass, support, perplexity).
    _C.TEST.ATTENTION_STATS = CN()
    _C.TEST.ATTENTION_STATS.ENABLED = False

    # Outputs whose (C, H, W) float32 scores would exceed this many MiB (e.g. a 12 MP photo
    # with 150 classes: 6.7 GiB) are returned as an (H, W) label map "sem_seg_labels",
    # computed in bands of rows, instead of "sem_seg" scores.
    _C.TEST.SEM_SEG_SCORES_MAX_MB = 1024.0

    # Boundary IoU of semantic segmentation (Cheng et al., CVPR 2021, "Boundary IoU: Improving
    # Object-Centric Image Segmentation Evaluation"; sparseclip_d2/evaluation/sem_seg_metrics.py):
    # per class, IoU of the pixels of the ground-truth and predicted masks within the dilation
    # width d of their own contour. d = max(1, round(DILATION_RATIO * image diagonal))
    # (bowenc0221/boundary-iou-api @ 37d2558 boundary_iou/utils/boundary_utils.py mask_to_boundary,
    # default dilation_ratio=0.02), or DILATION_PIXELS when > 0. Reported in results.json as
    # boundary_IoU (beside the share of classes with zero IoU, zero_IoU_share).
    _C.TEST.BOUNDARY_IOU = CN()
    _C.TEST.BOUNDARY_IOU.ENABLED = True
    _C.TEST.BOUNDARY_IOU.DILATION_RATIO = 0.02
    _C.TEST.BOUNDARY_IOU.DILATION_PIXELS = 0

    # Evaluate only the first N images of each test dataset (0 = all). Recorded in
    # results.json so a partial number is never mistaken for a full one.
    _C.TEST.MAX_IMAGES = 0

    # Patch logits times the window's CLS logits, per synonym (CLIPtrase's VOC20 rule).
    _C.MODEL.SPARSECLIP.CLS_LOGIT_PRODUCT = False
    # Centre-crop evaluation protocol (CLIPtrase; sparseclip_d2/data/center_crop.py): N > 0 resizes
    # image and ground truth to short side N and scores the centre N x N crop only; 0 disables
    # (replaces INPUT.MIN_SIZE_TEST / RESIZE_MODE when on).
    _C.INPUT.CENTER_CROP_TEST = 0
    _add_part_sections(_C)
    return cfg


def _add_part_sections(cfg) -> None:
    """Build every section a part registers from its settings dataclass (``methods/registry.py``
    ``CONFIG_SECTIONS``; each field declares its key and comment there), parents first:
    ``MODEL.SPARSECLIP.PROXY`` (the second backbone) and the last blocks built on it, the object
    presence, the cluster vote, label propagation and its VFM."""
    from .methods import CONFIG_SECTIONS

    for path, section in sorted(CONFIG_SECTIONS, key=lambda item: item[0].count(".")):
        parent, name = path.rsplit(".", 1)
        node = cfg
        for part in parent.split("."):
            node = node[part]
        node[name] = build_section(CN, section)


_check_number = check_number  # the one number check (common/keys.py)


def check_sparseclip_config(cfg) -> None:
    """Validate the user-facing inference keys of ``cfg`` before any model is built.

    Raises:
        ValueError: naming the key, its value and the valid range or choices.
    """
    inf = math.inf
    sw = cfg.TEST.SLIDING_WINDOW
    _check_number("TEST.SLIDING_WINDOW.CROP_SIZE", sw.CROP_SIZE, 1, inf, integer=True)
    _check_number("TEST.SLIDING_WINDOW.BATCH_SIZE", sw.BATCH_SIZE, 1, inf, integer=True)
    # A stride above the crop size would leave pixels no window covers.
    _check_number("TEST.SLIDING_WINDOW.STRIDE", sw.STRIDE, 1, sw.CROP_SIZE, integer=True)
    _check_number("TEST.MAX_IMAGES", cfg.TEST.MAX_IMAGES, 0, inf, integer=True)
    _check_number("TEST.SEM_SEG_SCORES_MAX_MB", cfg.TEST.SEM_SEG_SCORES_MAX_MB, 0, inf)
    _check_number("TEST.BOUNDARY_IOU.DILATION_RATIO", cfg.TEST.BOUNDARY_IOU.DILATION_RATIO, 0, 1)
    _check_number("TEST.BOUNDARY_IOU.DILATION_PIXELS", cfg.TEST.BOUNDARY_IOU.DILATION_PIXELS, 0, inf, integer=True)
    min_sizes = cfg.INPUT.MIN_SIZE_TEST
    for size in (min_sizes if isinstance(min_sizes, (list, tuple)) else [min_sizes]):
        _check_number("INPUT.MIN_SIZE_TEST", size, 0, inf, integer=True)
    _check_number("INPUT.MAX_SIZE_TEST", cfg.INPUT.MAX_SIZE_TEST, 1, inf, integer=True)
    if cfg.INPUT.FORMAT not in ("RGB", "BGR"):
        raise ValueError(f"INPUT.FORMAT = {cfg.INPUT.FORMAT!r} is invalid; valid: RGB, BGR")
    sc = cfg.MODEL.SPARSECLIP
    _check_number("MODEL.SPARSECLIP.LOGIT_SCALE", sc.LOGIT_SCALE, 0, inf)  # 0 = the model's own scale
    _check_number("MODEL.SPARSECLIP.PROB_THRESHOLD", sc.PROB_THRESHOLD, 0, 1)
    _check_number("MODEL.SPARSECLIP.AREA_THRESHOLD", sc.AREA_THRESHOLD, 0, 1)
    _check_number("MODEL.SPARSECLIP.TEXT.BATCH_SIZE", sc.TEXT.BATCH_SIZE, 1, inf, integer=True)
    if sc.CLIP.PRECISION not in ("fp32", "fp16", "bf16"):
        raise ValueError(f"MODEL.SPARSECLIP.CLIP.PRECISION = {sc.CLIP.PRECISION!r} is invalid; "
                         "valid: fp32, fp16, bf16")
    neg = sc.FGOVD.NUM_NEGATIVES
    if isinstance(neg, bool) or not isinstance(neg, int) or not (neg == -1 or neg >= 1):
        raise ValueError(f"MODEL.SPARSECLIP.FGOVD.NUM_NEGATIVES = {neg!r} is invalid; valid: an integer >= 1, "
                         "or -1 for the split's default (10; pattern 7; transparency 2)")
    check_device(cfg.MODEL.DEVICE)
    from .clip.builder import check_model_name
    from .clip.weights import parse_hf_pretrained

    try:
        check_model_name(sc.CLIP.NAME)
        parse_hf_pretrained(sc.CLIP.PRETRAINED)
    except (ValueError, FileNotFoundError) as e:
        raise ValueError(f"MODEL.SPARSECLIP.CLIP.NAME / PRETRAINED: {e}") from None
    from .methods.encoders import check_proxy_config

    check_proxy_config(cfg)  # MODEL.SPARSECLIP.PROXY.*
    _check_number("INPUT.CENTER_CROP_TEST", cfg.INPUT.CENTER_CROP_TEST, 0, inf, integer=True)
    from .methods import plan_from_config

    plan_from_config(cfg)  # every logit head's and stage's keys, then the one check of their combination
    _warn_ignored_values(cfg)


_DEFAULT_ALPHA = 1.2  # add_sparseclip_config's ATTENTION.ALPHA


def _warn_once(message: str, *args) -> None:
    text = message % args
    if text not in _WARNED:
        _WARNED.add(text)
        logger.warning(text)


def _warn_ignored_values(cfg) -> None:
    """Warnings (once per process each) for values that are valid but do not do what they
    seem to: an ALPHA its NORMALIZER ignores, a MAX_SIZE_TEST below MIN_SIZE_TEST."""
    att = cfg.MODEL.SPARSECLIP.ATTENTION
    from .attention.normalizers import NORMALIZERS_WITHOUT_ALPHA
    from .methods import ENCODERS

    read_elsewhere = any(family.reads_alpha(cfg) for _, family in ENCODERS)  # an encoder's own normaliser
    if att.NORMALIZER in NORMALIZERS_WITHOUT_ALPHA and float(att.ALPHA) != _DEFAULT_ALPHA and not read_elsewhere:
        _warn_once("MODEL.SPARSECLIP.ATTENTION.ALPHA = %g is ignored by NORMALIZER %s; it applies to "
                   "NORMALIZER entmax (and the random_matched control)%s", att.ALPHA, att.NORMALIZER,
                   "; NORMALIZER sparsemax is alpha 2" if att.NORMALIZER == "sparsemax" else "")
    min_sizes = cfg.INPUT.MIN_SIZE_TEST
    min_sizes = [m for m in (min_sizes if isinstance(min_sizes, (list, tuple)) else [min_sizes]) if m > 0]
    if min_sizes and cfg.INPUT.MAX_SIZE_TEST < max(min_sizes):
        _warn_once("INPUT.MAX_SIZE_TEST = %d is below INPUT.MIN_SIZE_TEST = %d: the long side of every image "
                   "is capped at %d px, so images are processed smaller than MIN_SIZE_TEST (coarse "
                   "predictions); raise INPUT.MAX_SIZE_TEST", cfg.INPUT.MAX_SIZE_TEST, max(min_sizes),
                   cfg.INPUT.MAX_SIZE_TEST)


def _float_keys_given_ints(cfg, tree, prefix=""):
    """``(dotted key, value)`` of every int in the nested dict ``tree`` whose key holds a
    float in ``cfg`` (bools excluded)."""
    for key, value in tree.items():
        if key not in cfg:
            continue
        full = prefix + key
        if isinstance(value, dict) and isinstance(cfg[key], CN):
            yield from _float_keys_given_ints(cfg[key], value, full + ".")
        elif (isinstance(value, int) and not isinstance(value, bool) and isinstance(cfg[key], float)):
            yield full, value


def _ints_to_floats(cfg, tree):
    """``tree`` (a nested dict) with ints turned into floats where ``cfg`` holds floats."""
    out = {}
    for key, value in tree.items():
        if key in cfg and isinstance(value, dict) and isinstance(cfg[key], CN):
            value = _ints_to_floats(cfg[key], value)
        elif (key in cfg and isinstance(value, int) and not isinstance(value, bool)
              and isinstance(cfg[key], float)):
            value = float(value)
        out[key] = value
    return out


def coerce_opts(cfg, opts):
    """``KEY VALUE`` overrides (``merge_from_list`` format) with integer literals given to
    float keys written as floats (``ATTENTION.ALPHA 2`` -> ``2.0``), which yacs would
    refuse with "Type mismatch (float vs int)". Other values are passed on unchanged."""
    opts = list(opts)
    out = []
    for key, value in zip(opts[0::2], opts[1::2]):
        node, ok = cfg, True
        for part in key.split("."):
            if isinstance(node, CN) and part in node:
                node = node[part]
            else:
                ok = False
                break
        if ok and isinstance(node, float) and isinstance(value, str):
            try:
                literal = ast.literal_eval(value)
            except (ValueError, SyntaxError):
                literal = None
            if isinstance(literal, int) and not isinstance(literal, bool):
                value = repr(float(literal))
        out.extend([key, value])
    return out + opts[len(out):]  # an odd trailing item is left for merge_from_list to refuse


def merge_config(cfg, config_file=None, opts=()):
    """``cfg.merge_from_file(config_file)`` then ``cfg.merge_from_list(opts)``, with integer
    literals accepted for float keys in both (``ALPHA: 2`` in a file, ``ALPHA 2`` on the
    command line; yacs alone refuses them). The file is read with detectron2's public
    ``load_yaml_with_base``; when it gives an int to a float key, the loaded config (of the
    current version) is merged with ``merge_from_other_cfg``, else ``merge_from_file`` runs
    unchanged. ``config_file`` may also be a packaged config name (``entmax_qq_l14``,
    :mod:`sparseclip_d2.model_zoo`). Returns ``cfg``."""
    if config_file:
        from .model_zoo import resolve_config_file

        config_file = resolve_config_file(config_file)  # a file, or a packaged config name
        loaded = cfg.load_yaml_with_base(config_file, allow_unsafe=True)
        version = loaded.get("VERSION", cfg.get("VERSION")) if isinstance(loaded, dict) else None
        if (isinstance(loaded, dict) and version == cfg.get("VERSION")
                and any(True for _ in _float_keys_given_ints(cfg, loaded))):
            cfg.merge_from_other_cfg(type(cfg)(_ints_to_floats(cfg, loaded)))
        else:
            cfg.merge_from_file(config_file)
    cfg.merge_from_list(coerce_opts(cfg, opts))
    return cfg


def check_device(device) -> None:
    """Raise ValueError unless ``device`` is cpu, cuda, cuda:N or mps (named in the error)."""
    import torch

    try:
        kind = torch.device(str(device)).type
    except (RuntimeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(f"MODEL.DEVICE = {device!r} is not a supported device; "
                         "valid: cpu, cuda, cuda:N (GPU index N), mps")
