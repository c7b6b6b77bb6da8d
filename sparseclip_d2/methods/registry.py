"""The registries of the one inference pipeline: logit heads, post-processing stages and per-image
side inputs, and the one place where combinations of parts are refused.

The segmentation META_ARCH (``modeling.meta_arch.SparseCLIP``) runs, per image::

    encoder (CLIP with its attention spec, or a second-backbone encoder)
      -> logit head, per window            (LOGIT_HEADS: cosine, tta, cls_product, ...)
      -> stages of kind "windows"           (replace the window loop: label propagation)
      -> stages of kind "logits"            (output-size logits: PAMR)
      -> the background rules (ScoreMaps)
      -> stages of kind "labels"            (cluster vote, region vote, label closing)

Every part states what it needs (:class:`~sparseclip_d2.common.needs.Needs`) and what it can
do (``records_attention``, ``passes_encoder_inputs``, ``reads_correlation``); :func:`check_parts`
derives every refusal from those declarations, once, before any weight is loaded, and again
with the real encoder when the model is built.

A head or a stage is a class registered with ``@LOGIT_HEADS.register()`` /
``@STAGES.register()`` whose ``from_config(cfg, clip)`` returns an instance when the config
switches it on and None otherwise (``clip``: the built CLIP parts, or None while only
validating); ``settings_from_config(cfg)`` validates its keys without building it. Writing a
method: ``docs/writing_a_method.md``.

:data:`UPSTREAM` is not part of the pipeline: it holds each method's entry in the timing
benchmark against its upstream code (:class:`UpstreamEntry`).
"""
import dataclasses
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

from ..common.needs import Needs

__all__ = ["Registry", "Part", "LOGIT_HEADS", "STAGES", "SIDE_INPUTS", "ENCODERS", "CONFIG_SECTIONS", "UPSTREAM",
           "STAGE_KINDS", "LogitHead", "Stage", "SideInput", "EncoderFamily", "UpstreamEntry", "ImageInputs",
           "PipelinePlan", "check_parts", "mmseg_dataset_configs"]


class Registry:
    """Named parts of one kind, in registration order; ``get`` names the valid choices."""

    def __init__(self, what: str):
        self.what = what
        self._items: Dict[str, type] = {}

    def register(self, name: str):
        def deco(obj):
            if name in self._items:
                raise ValueError(f"{self.what}: {name!r} is registered twice")
            self._items[name] = obj
            return obj
        return deco

    def get(self, name: str):
        if name not in self._items:
            raise KeyError(f"unknown {self.what} {name!r}; valid: {', '.join(self._items)}")
        return self._items[name]

    def name_of(self, obj) -> str:
        """The registered name of a part (an instance or its class)."""
        cls = obj if isinstance(obj, type) else type(obj)
        for name, c in self._items.items():
            if c is cls:
                return name
        raise KeyError(f"{cls.__name__} is not a registered {self.what}; valid: {', '.join(self._items)}")

    def __contains__(self, name: str) -> bool:
        return name in self._items

    def __iter__(self):
        return iter(list(self._items.items()))


LOGIT_HEADS = Registry("logit head")
LOGIT_HEADS.__doc__ = """Per-window logit heads: ``(N, 3, h, w)`` windows -> ``(N, S, h/p, w/p)`` scaled logits.

A head subclasses :class:`LogitHead`. Exactly one head runs; ``cosine`` when no other is on."""

STAGES = Registry("post-processing stage")
STAGES.__doc__ = """Post-processing stages, each of one kind in :data:`STAGE_KINDS` (see :class:`Stage`)."""

SIDE_INPUTS = Registry("side input")
SIDE_INPUTS.__doc__ = """Per-image inputs besides the image that an encoder declares in its ``needs``
(``region_mask``), read from the input dict or from a file, and cut into the windows."""

ENCODERS = Registry("second-backbone encoder")
ENCODERS.__doc__ = """Encoders whose last block is built on the second backbone (``MODEL.SPARSECLIP.PROXY.*``),
each a :class:`EncoderFamily`; one is the default (built when a proxy is set and no other is on)."""

CONFIG_SECTIONS = Registry("config section")
CONFIG_SECTIONS.__doc__ = """``{dotted config path: common.keys.Section}`` of the parts' settings: a family registers
the section its settings dataclass declares, and ``add_sparseclip_config`` builds every one (parents first)."""

UPSTREAM = Registry("upstream benchmark entry")
UPSTREAM.__doc__ = """The method-vs-upstream timing benchmark's entries (``tools/benchmark_methods.py``, the harness in
``sparseclip_d2/benchmarks/``): each a :class:`UpstreamEntry`, registered by its method's folder (``upstream.py``)
under the method's command-line name; the benchmark lists them in registration order."""

#: the stage kinds in the order they run
STAGE_KINDS = ("windows", "logits", "labels")


@dataclasses.dataclass
class ImageInputs:
    """One image's state through the pipeline.

    Fields:
        x: the input dict.
        vocabulary: class names (comma-separated synonyms); background_index: or None.
        text_emb: ``(S, D)`` unit synonym embeddings; class_index: ``(S,)`` class of each synonym.
        image: ``(3, H, W)`` normalised float32 RGB at the working size.
        out_size: ``(height, width)`` of the output.
        side: ``{name: (H, W) map at the working size}`` of the encoder's side inputs.
        side_full: the same at the output size (what label stages read).
        correlation: the tapped block's self-correlation of each window, filled by the window loop
            when a part needs ``correlation_layer``.
        context: what the head's :meth:`LogitHead.image_context` returned.
    """

    x: Dict
    vocabulary: List[str]
    background_index: Optional[int]
    text_emb: torch.Tensor
    class_index: torch.Tensor
    image: torch.Tensor
    out_size: Tuple[int, int]
    side: Dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    side_full: Dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    correlation: List[torch.Tensor] = dataclasses.field(default_factory=list)
    context: Any = None


class Part(nn.Module):
    """What every head and stage has: ``key`` (the config key that switches it on, named in
    messages), ``settings_from_config(cfg)`` (validate its keys; its settings when the config
    switches it on, else None), ``from_config(cfg, clip)`` (the part built from them, or None;
    ``clip`` the built CLIP parts) and ``describe()`` (one line for titles, "" for the default)."""

    key = ""

    @classmethod
    def settings_from_config(cls, cfg):
        raise NotImplementedError

    @classmethod
    def from_config(cls, cfg, clip) -> Optional["Part"]:
        raise NotImplementedError

    def describe(self) -> str:
        return ""


class LogitHead(Part):
    """Contract of a logit head (a module: a head may hold a second view of the tower).

    ``forward(model, images, text_emb, inputs, sink, context)``: ``images`` ``(N, 3, h, w)``
    normalised windows (``h, w`` multiples of the patch), ``text_emb`` ``(S, D)`` unit synonym
    embeddings, ``inputs`` the encoder's keyword inputs built from its ``needs`` (pass them on
    when ``passes_encoder_inputs``), ``sink`` None or a list to append the last block's attention
    of each window to (only when ``records_attention``), ``context`` what :meth:`image_context`
    returned for the windows' image. Returns ``(N, S, h/p, w/p)`` float32 logits with the logit
    scale ``model.logit_scale`` applied.

    Declarations: ``key`` (the config key that switches it on, for messages),
    ``passes_encoder_inputs``, ``records_attention``, ``reads_correlation`` (implements
    :meth:`with_correlation`).
    """

    passes_encoder_inputs = True
    records_attention = False
    reads_correlation = False

    def text_embeddings(self, classifier, vocabulary: Sequence[str], background_index: Optional[int]):
        """``(emb (S, D) float32, class_index (S,) long)`` of a vocabulary, which :meth:`forward` gets as
        ``text_emb``: the text classifier's unit embeddings by default; a head that compares in another
        space (a learned text projection) gives its own."""
        return classifier(list(vocabulary))

    def image_context(self, model, image: torch.Tensor, text_emb: torch.Tensor) -> Any:
        """What the head needs once per image (``(3, H, W)`` normalised), passed to every window."""
        return None

    def with_correlation(self, model, images, text_emb, inputs, layer: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(logits, (N, h*w, h*w) self-correlation of block ``layer``)`` from one encoding pass."""
        raise NotImplementedError(f"the {type(self).__name__} head does not read a block's self-correlation")


class Stage(Part):
    """Contract of a post-processing stage (a module: a stage may hold a second backbone).

    ``kind`` is one of :data:`STAGE_KINDS`:

    - ``windows``: ``forward(model, inputs, window_logits_fn) -> (logits (S, H, W), class_index)``
      replaces the window loop (``window_logits_fn(crops)`` gives the head's logits of windows);
    - ``logits``: ``forward(model, inputs, logits (S, h, w)) -> logits`` (may resize to the
      output size);
    - ``labels``: ``forward(model, inputs, labels (H_out, W_out) long) -> labels``; the output is
      then a label map (``sem_seg_labels``).

    Declarations: ``needs`` (:class:`Needs`), ``records_attention`` (False: an attention record
    cannot be taken with it), ``excludes`` (names of stages it cannot run with, and why).
    """

    kind = "labels"
    needs = Needs()
    records_attention = True
    excludes: Dict[str, str] = {}


class SideInput:
    """Contract of a per-image side input named like its :class:`Needs` field.

    ``full(model, x, out_size) -> (H_out, W_out) tensor`` at the output size;
    ``working(full, image_size) -> (H, W)`` at the working size (cut into the windows with the
    image, padded with ``pad_value``); ``encoder_keyword``: the encoder's keyword for the windows.
    """

    name = ""
    encoder_keyword = ""
    pad_value: float = 0

    def __init__(self, cfg=None):
        self.cfg = cfg

    def full(self, model, x: Dict, out_size: Tuple[int, int]) -> torch.Tensor:
        raise NotImplementedError

    def working(self, full: torch.Tensor, image_size: Tuple[int, int]) -> torch.Tensor:
        raise NotImplementedError


class EncoderFamily:
    """Contract of an encoder family built on the second backbone (registered in :data:`ENCODERS`).

    Declarations: ``key`` (the switch key, named in messages; "" for the default family),
    ``default`` (built when a proxy is set and no other family is on), ``needs`` (what its
    encoder needs besides the windows, read before it is built).

    ``switched_on(cfg)``: whether the config turns it on (its switch alone, nothing validated; by
    default the value of ``key``);
    ``settings_from_config(cfg)``: its validated settings, or None when off (then its other keys
    must keep their defaults); ``check(cfg, proxy_options, settings)``: what it needs of the rest
    of the config (a ValueError naming the key and the valid values); ``build(cfg, visual, spec,
    proxy, settings, crop_size, pos_embed_interp, attn_pool_dense)``: the encoder;
    ``reads_alpha(cfg)``: whether it reads ``ATTENTION.ALPHA`` beyond the spec's normaliser.
    """

    key = ""
    default = False
    needs = Needs()

    @classmethod
    def switched_on(cls, cfg) -> bool:
        """Whether the switch key ``key`` (a dotted config key) is truthy; False for the default
        family, which has none. Families whose switch is not one key override it."""
        if cls.default or not cls.key:
            return False
        node = cfg
        for part in cls.key.split("."):
            node = getattr(node, part)
        return bool(node)

    @classmethod
    def settings_from_config(cls, cfg):
        return None

    @classmethod
    def check(cls, cfg, proxy_options, settings) -> None:
        return None

    @classmethod
    def build(cls, cfg, visual, spec, proxy, settings, **kw):
        raise NotImplementedError

    @classmethod
    def reads_alpha(cls, cfg) -> bool:
        return False


class UpstreamEntry:
    """Contract of a method's entry in the upstream timing benchmark (``tools/benchmark_methods.py``):
    a class in the method's folder (``methods/<family>/upstream.py``) registered in :data:`UPSTREAM`
    under the method's command-line name (``--methods NAME``, ``--NAME PATH``, ``--NAME-python``).
    Its module imports nothing heavy at module level (the methods package imports it) and never
    this project's model code at all: the upstream worker imports it alone (the ``__init__`` of
    the packages above it skipped), possibly in another environment; it never copies upstream
    code, it drives the checkout's own. docs/writing_a_method.md, "An upstream benchmark entry".

    Declarations, read by the harness:

    - ``repo`` (``owner/name`` on GitHub), ``commit`` (the one the agreement rows compare with,
      docs/upstream_agreement.md), ``marker`` (a file only that checkout has, from its root);
      ``subdir``: the checkout's folder holding its code and configs ("" for the root);
    - ``config``: the project config, ``configs/baselines/<config>``;
    - ``kind``: how both sides are fed: ``"segmentor"`` (the photo resized by mmcv's rule
      through a segmentor), ``"encoder"`` (a dense forward on the same normalised S x S image)
      or ``"folder"`` (the checkout's own loop over a folder holding the photo; ``dataset``:
      the project dataset whose test mapper reads it);
    - the vocabulary of a segmentor: ``class_file`` (a ``cls_*.txt`` under ``subdir``) or
      ``class_tuple`` (``(file, class)`` whose ``CLASSES`` is it); ``upstream_config``: the
      checkout's config file its driver reads;
    - ``needs_dino``: what of its torch.hub checkout its upstream uses, a phrase for the option's
      help ("" when it needs none); ``hub``: which checkout that is, by its option's name
      (``"dino"``: facebookresearch/dino, ``--dino``; ``"dinov2"``: facebookresearch/dinov2,
      ``--dinov2``; ``sparseclip_d2.benchmarks.entries.HUBS``); ``vfm``: the hub entry whose random
      weights (seed 0, drawn by the upstream worker) both sides load (:meth:`vfm_file`);
      ``dino_aliases``: more option strings meaning ``--dino``;
    - ``sample_reads_file``: upstream's data sample reads the resized photo from a file
      (``spec['image_file']``, written by the harness);
    - ``cuda``: its ``build`` honours ``spec['device']`` (``"cuda"``: the GPU benchmark,
      ``tools/benchmark_methods_gpu.sh``); False: the CPU only, and the GPU table has no upstream
      figure for it.

    Declarations read by the agreement driver (``tools/agreement.py``, docs/agreement/README.md):

    - ``configs``: ``{project config: upstream config}`` of the rows (the upstream file relative to
      ``subdir``); a project config not in it is compared with the mmseg-style
      ``configs/cfg_<dataset>.py`` (``sparseclip_d2.benchmarks.agreement.upstream_config_for``);
      :meth:`agreement_configs` lists the rows' configs; ``config_settings``: ``{project config:
      {name: value}}``, upstream settings a project config implies beyond its upstream file (PEARL's
      TLP-off config: ``use_prop="off"``);
    - ``forcing``: ``{variant: (project overrides [KEY, VALUE, ...], upstream settings {name: value})}``,
      the stage-forcing variants (``--force``): a stage that random weights leave flat (a first
      segmentation with one label, a probability threshold that sends every pixel to the
      background) made to act, the same way on both sides.
    - ``config_path_prefix``: the folder the checkout's config files put before the paths they
      name, when they are written from the checkout's parent folder (ITACLIP's
      ``./ITACLIP/configs/cls_voc21.txt``); :meth:`checkout_path` drops it.

    A ``build`` reads the row's upstream config, class file and settings with
    :meth:`upstream_config_of`, :meth:`class_file_of` and :meth:`settings_of` (the entry's own
    when the spec does not name them: the timing benchmark).

    Hooks (class methods):

    - ``project_opts(path, workdir, drawn)``: the project side's config overrides beyond the
      shared ones (CPU, weights, templates), as ``[KEY, VALUE, ...]``; ``path`` the checkout
      (None with ``--project-only`` and no path), ``drawn`` whether the upstream worker draws the
      VFM weights (:meth:`vfm_file`) both sides load; runs in the tool's process;
    - ``class_tuple_of(root, upstream_config)``: the ``class_tuple`` of a row's upstream config
      (LPOSS: its dataset config's ``dataset_type``); ``class_tuple`` by default;
    - ``row_opts(root, model)``: the project side's overrides that an agreement row implies from its
      upstream config's ``model`` dict (``root``: the folder holding the code), as ``[KEY, VALUE, ...]``
      after ``project_opts``' (ITACLIP: the dataset's auxiliary text file); none by default;
    - ``input_opts(rgb, mdir)``: the agreement driver's overrides for files of one row's input that
      both sides read, written to the row's folder ``mdir`` (CorrCLIP's region mask of the photo);
    - ``build(spec, image, path, kit)``: in the upstream worker, ``run()`` of one image through
      the checkout's code (``path``: the folder holding it, the working directory; ``image``:
      the input array; ``spec``: the worker's spec, ``spec['weights']`` the CLIP weights file);
      ``kit``: the harness's generic helpers (``sparseclip_d2.benchmarks.upstream.upstream_kit``:
      stand-ins, config readers, the segmentor runs).
    """

    repo = ""
    commit = ""
    marker = ""
    subdir = ""
    config = ""
    kind = "segmentor"
    dataset = ""
    class_file = ""
    class_tuple: Optional[Tuple[str, str]] = None
    upstream_config = ""
    needs_dino = ""
    hub = "dino"
    vfm = "dino_vitb8"
    dino_aliases: Tuple[str, ...] = ()
    sample_reads_file = False
    cuda = False
    configs: Dict[str, str] = {}
    config_settings: Dict[str, Dict[str, Any]] = {}
    forcing: Dict[str, Tuple[Tuple[str, ...], Dict[str, Any]]] = {}
    config_path_prefix = ""

    @classmethod
    def agreement_configs(cls) -> List[str]:
        """The project configs of the agreement rows: ``configs``' keys, else ``config``."""
        return list(cls.configs) or [cls.config]

    @classmethod
    def upstream_config_of(cls, spec: Dict) -> str:
        """The upstream config file of this run: the spec's (an agreement row's), else ``upstream_config``."""
        return spec.get("upstream_config") or cls.upstream_config

    @classmethod
    def class_file_of(cls, spec: Dict) -> str:
        """The class file of this run: the spec's (the row's upstream config's ``name_path``), else ``class_file``."""
        return spec.get("class_file") or cls.class_file

    @classmethod
    def settings_of(cls, spec: Dict) -> Dict[str, Any]:
        """Upstream settings that override the config's model dict (a stage-forcing variant's), else none."""
        return dict(spec.get("upstream_settings") or {})

    @classmethod
    def labels(cls, output, spec: Dict):
        """The ``(H, W)`` label map of what ``build``'s ``run()`` returned: the first data sample's
        ``pred_sem_seg`` (an mmseg-style segmentor's ``predict``) or an ``(H, W)`` / ``(1, H, W)``
        tensor; an entry whose run returns something else overrides this."""
        if isinstance(output, (list, tuple)) and output and hasattr(output[0], "pred_sem_seg"):
            output = output[0].pred_sem_seg.data
        if isinstance(output, torch.Tensor) and output.dim() in (2, 3):
            return output.reshape(output.shape[-2:]).cpu().numpy()
        raise TypeError(f"{cls.__name__}: its run() returned {type(output).__name__}, not a label map; "
                        "the entry needs a labels() hook for the agreement driver")

    @classmethod
    def vfm_file(cls, workdir: str) -> str:
        """The random VFM state dict both sides load, in ``workdir`` (the upstream worker draws it)."""
        return os.path.join(workdir, f"{cls.vfm}_seed0.pth")

    @classmethod
    def project_opts(cls, path: Optional[str], workdir: str, drawn: bool) -> List[str]:
        return []

    @classmethod
    def row_opts(cls, root: str, model: Dict[str, Any]) -> List[str]:
        return []

    @classmethod
    def class_tuple_of(cls, root: str, upstream_config: str) -> Optional[Tuple[str, str]]:
        """``(file, class)`` whose ``CLASSES`` is the vocabulary of a row with ``upstream_config``
        (``root``: the folder holding the code): ``class_tuple`` (None: a class file)."""
        return cls.class_tuple

    @classmethod
    def checkout_path(cls, rel: str) -> str:
        """A path named in the checkout's config files, relative to the checkout: ``rel`` normalised,
        ``config_path_prefix`` dropped from its front."""
        rel = os.path.normpath(rel)
        head, _, tail = rel.partition(os.sep)
        return tail if cls.config_path_prefix and head == cls.config_path_prefix and tail else rel

    @classmethod
    def input_opts(cls, rgb, mdir: str) -> List[str]:
        """The project side's overrides for files of this input that both sides read (the agreement
        driver: ``rgb`` the row's ``(H, W, 3)`` photo, ``mdir`` its folder, where the upstream worker's
        spec points: ``mdir/masks``); after :meth:`project_opts`, so they win; none by default."""
        return []

    @classmethod
    def build(cls, spec: Dict, image, path: str, kit):
        raise NotImplementedError


#: dataset of a project config name's suffix -> the mmseg-style upstream config file name that many
#: training-free checkouts share (``configs/cfg_<dataset>.py``; COCO-Stuff 164k, Cityscapes spelt their way)
_MMSEG_DATASET_CONFIGS = {
    "voc21": "configs/cfg_voc21.py", "voc20": "configs/cfg_voc20.py", "context60": "configs/cfg_context60.py",
    "context59": "configs/cfg_context59.py", "coco_object": "configs/cfg_coco_object.py",
    "coco_stuff": "configs/cfg_coco_stuff164k.py", "cityscapes": "configs/cfg_city_scapes.py",
    "ade20k": "configs/cfg_ade20k.py"}


def mmseg_dataset_configs(prefix: str, bare: str, suffixes: Sequence[str]) -> Dict[str, str]:
    """``{project config: upstream config}`` of a method whose checkout keeps those config names:
    ``<prefix>.yaml`` is the ``bare`` dataset's, ``<prefix>_<suffix>.yaml`` each suffix's."""
    out = {f"{prefix}_{sfx}.yaml": _MMSEG_DATASET_CONFIGS[sfx] for sfx in suffixes}
    out[f"{prefix}.yaml"] = _MMSEG_DATASET_CONFIGS[bare]
    return out


@dataclasses.dataclass(frozen=True)
class PipelinePlan:
    """The parts a config switches on, validated, before anything is built: the head's registry
    name and its settings, and ``[(stage name, settings)]`` in run order."""

    head: str
    head_settings: Any
    stages: Tuple[Tuple[str, Any], ...]


def check_parts(encoder: Tuple[Needs, str], head, stages: Sequence, *, sliding_window: bool, patch_remainder: str,
                attention_stats: bool) -> None:
    """Refuse the combinations the parts' declarations rule out, one clear error each.

    Args:
        encoder: ``(needs, the config key or name of the encoder)``.
        head: the head class (or instance); stages: the stage classes (or instances), in order.
        sliding_window, patch_remainder, attention_stats: the META_ARCH's settings.
    """
    enc_needs, enc_key = encoder
    if not head.passes_encoder_inputs:
        for needed, what in ((enc_needs.text, "the class texts"), (enc_needs.region_mask, "per-window region masks"),
                             (enc_needs.first_segmentation, "a first segmentation (a second pass)"),
                             (enc_needs.whole_windows, "the whole windows of truncated crops")):
            if needed:
                raise ValueError(f"{head.key} cannot be combined with {enc_key}: the encoder needs {what}, which "
                                 f"the {head.key} views do not carry; turn one of them off")
    if attention_stats and not head.records_attention:
        raise ValueError(f"{head.key} cannot be combined with TEST.ATTENTION_STATS.ENABLED (its logits are not "
                         "those of one recorded attention); turn one of them off")
    for stage in stages:
        if attention_stats and not stage.records_attention:
            raise ValueError(f"{stage.key} cannot be combined with TEST.ATTENTION_STATS.ENABLED; turn one of them off")
        for other in stages:
            if other is not stage and _stage_name(other) in stage.excludes:
                raise ValueError(f"{stage.key} cannot be combined with {other.key} "
                                 f"({stage.excludes[_stage_name(other)]}); turn one of them off")
        n = stage.needs
        if n.correlation_layer is not None and (enc_needs.text or enc_needs.region_mask):
            raise ValueError(f"{stage.key} cannot be combined with {enc_key}: it taps a block of CLIP's own encoding "
                             "pass, which that encoder replaces; turn one of them off")
        if n.correlation_layer is not None and not head.reads_correlation:
            raise ValueError(f"{stage.key} cannot be combined with {head.key}: it reads a block's self-correlation "
                             "from the encoding pass, which that logit head does not give; turn one of them off")
        if n.whole_image and sliding_window:
            raise ValueError(f"{stage.key} True works on one whole-image forward; TEST.SLIDING_WINDOW.ENABLED = True "
                             "is invalid with it; valid: False")
        if n.whole_image and patch_remainder != "pad_crop":
            raise ValueError(f"{stage.key} True maps the patches back with symmetric padding; "
                             f"MODEL.SPARSECLIP.PATCH_REMAINDER = {patch_remainder!r} is invalid with it; valid: pad_crop")


def _stage_name(stage) -> str:
    return STAGES.name_of(stage)
