"""What an inference part declares it needs: the contract between the encoders, logit heads and
post-processing stages of the one pipeline (``sparseclip_d2.methods``) and the META_ARCH that
runs them. Nobody probes a part for attributes: a part states its needs here and
:func:`sparseclip_d2.methods.registry.check_parts` derives every refusal from them."""
import dataclasses
from typing import Optional

__all__ = ["Needs"]


@dataclasses.dataclass(frozen=True)
class Needs:
    """The inputs a part needs besides the normalised windows.

    Fields:
        text: the encoder takes the unit synonym embeddings (``text_emb=(S, D)``) in its forward
            (a last block that classifies).
        region_mask: the encoder takes per-window integer region maps (``region_masks=(N, h, w)``)
            cut from a per-image side input ``input["region_mask"]`` (or a file beside the image).
        first_segmentation: the encoder runs its last block twice and takes a callable that turns
            the first pass into a prior (``feedback=``), built by the META_ARCH from the text.
        whole_image: the part works on the whole image as one window (no sliding window,
            ``PATCH_REMAINDER pad_crop``).
        whole_windows: the encoder also takes the whole windows (``windows=(N, 3, h', w')``) whose
            top-left multiple of the patch size the crops are under ``PATCH_REMAINDER truncate``
            (the crops themselves otherwise): a second backbone that sees the whole window while
            CLIP's patch convolution drops the remainder (CASS's DINO input).
        correlation_layer: the part reads the self-correlation map of this block (0-based,
            negative from the end) from the same encoding pass; None = none.
    """

    text: bool = False
    region_mask: bool = False
    first_segmentation: bool = False
    whole_image: bool = False
    whole_windows: bool = False
    correlation_layer: Optional[int] = None

    def side_inputs(self) -> tuple:
        """The names of the per-image side inputs needed (``methods.SIDE_INPUTS``)."""
        return ("region_mask",) if self.region_mask else ()

    def __or__(self, other: "Needs") -> "Needs":
        if self.correlation_layer is not None and other.correlation_layer is not None \
                and self.correlation_layer != other.correlation_layer:
            raise ValueError(f"two parts read the self-correlation of different blocks ({self.correlation_layer} "
                             f"and {other.correlation_layer}); one encoding pass taps one block")
        layer = self.correlation_layer if self.correlation_layer is not None else other.correlation_layer
        return Needs(text=self.text or other.text, region_mask=self.region_mask or other.region_mask,
                     first_segmentation=self.first_segmentation or other.first_segmentation,
                     whole_image=self.whole_image or other.whole_image,
                     whole_windows=self.whole_windows or other.whole_windows, correlation_layer=layer)
