"""The per-method table of the benchmark: each method's upstream repository, the commit its
agreement rows compare with (docs/upstream_agreement.md), the file only that checkout has, the
project config and how the upstream side is driven; the DINO checkout the VFM methods need.

Standard library only: the upstream worker imports it (:mod:`.upstream`).
"""
import os

#: One entry per method: the upstream repository, the commit the agreement rows compare with
#: (docs/upstream_agreement.md), a file that only that checkout has, the project config and
#: how the upstream side is driven.
METHODS = {
    "itaclip": dict(repo="m-arda-aydn/ITACLIP", commit="521a33c", marker="itaclip_segmentor.py",
                    config="itaclip_b16_voc21.yaml", kind="segmentor",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt",
                    definitions="llama_generated_texts/voc21_definitions.txt"),
    "resclip": dict(repo="yvhangyang/ResCLIP", commit="0e085f7", marker="resclip_segmentor.py",
                    config="resclip_b16_voc21.yaml", kind="segmentor",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "gem": dict(repo="WalBouss/GEM", commit="5fa677c", marker="gem/gem_wrapper.py",
                config="gem_b16.yaml", kind="encoder"),
    "clipsurgery": dict(repo="xmed-lab/CLIP_Surgery", commit="d4696d4", marker="clip/clip_surgery_model.py",
                        config="clipsurgery_b16.yaml", kind="encoder"),
    "proxyclip": dict(repo="mc-lan/ProxyCLIP", commit="e7b767f", marker="proxyclip_segmentor.py",
                      config="proxyclip_b16_voc21.yaml", kind="segmentor",
                      upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "scclip": dict(repo="SuleBai/SC-CLIP", commit="0417ba9", marker="scclip_segmentor.py",
                   config="scclip_b16_voc21.yaml", kind="segmentor",
                   upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # the SFP repository holds its code in SFP_ICCV/ (its README: cd SFP_ICCV, python eval.py)
    "sfp": dict(repo="Kimsure/SFP", commit="2804f5b", marker="SFP_ICCV/SFP_segmentor.py", subdir="SFP_ICCV",
                config="sfp_b16_voc21.yaml", kind="segmentor",
                upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "fsa": dict(repo="chi-chi-zx/FSA", commit="dbd2da5", marker="FSA_Proxy_segmentor.py",
                config="fsa_b16_voc21.yaml", kind="segmentor",
                upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # clip_self_correlation.py self_clip_test: self_clip(clip, "VOC21", image_size=224, eps=0.7, min=3)
    "cliptrase": dict(repo="leaves162/CLIPtrase", commit="2b7de61", marker="clip_self_correlation.py",
                      config="cliptrase_b16.yaml", kind="folder", dataset="sparseclip_voc21_val",
                      upstream_dataset="VOC21", image_size=224, eps=0.7, min_samples=3),
    # the four below are driven as their agreement rows drive them (docs/upstream_agreement.md);
    # vfm: the torch.hub DINO entry whose random weights (seed 0) both sides load
    "cass": dict(repo="MICV-yonsei/CASS", commit="228ecdd", marker="cass_segmentor.py",
                 config="cass_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb8",
                 upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    # the CorrCLIP repository holds the segmentor of its paper's first version in CorrCLIPv1/
    "corrclip": dict(repo="zdk258/CorrCLIP", commit="103bc18", marker="CorrCLIPv1/corrclip_segmentor.py",
                     subdir="CorrCLIPv1", config="corrclip_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb8",
                     upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
    "lposs": dict(repo="vladan-stojnic/LPOSS", commit="e489a74", marker="segmentation/evaluation/lposs_eval.py",
                  config="lposs_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb16", upstream_config="configs/lposs.yaml",
                  # segmentation/datasets/pascal_voc.py PascalVOCDataset.CLASSES (";" between synonyms)
                  class_tuple=("segmentation/datasets/pascal_voc.py", "PascalVOCDataset"),
                  # segmentation/configs/_base_/datasets/pascal_voc12.py test_cfg
                  test_cfg=dict(mode="slide", stride=(112, 112), crop_size=(224, 224))),
    "trident": dict(repo="YuHengsss/Trident", commit="a93b346", marker="trident.py",
                    config="trident_b16_voc21.yaml", kind="segmentor", vfm="dino_vitb16",
                    upstream_config="configs/cfg_voc21.py", class_file="configs/cls_voc21.txt"),
}
#: methods whose upstream loads DINO through torch.hub (or, CASS, DINO's release file): --dino needed
NEEDS_DINO = ("proxyclip", "fsa", "cass", "corrclip", "lposs", "trident")
#: ProxyCLIP loads its VFM with torch.hub.load('facebookresearch/dino:main', 'dino_vitb8'):
#: the tool answers that from a local checkout (--dino) with random weights; FSA's segmentor too.
DINO = dict(repo="facebookresearch/dino", commit="7c446df", marker="hubconf.py")
#: the help of --dino: which segmentors load the DINO hub code it names
DINO_HELP = (f"a {DINO['repo']} checkout (commit {DINO['commit']}): the torch.hub VFM code "
             f"ProxyCLIP's, FSA's, CorrCLIP's, LPOSS's and Trident's segmentors load (CASS: its random "
             f"weights; needed by {', '.join(NEEDS_DINO)})")


def vfm_file(method: str, workdir: str) -> str:
    """The random VFM state dict both sides of ``method`` load (the upstream worker draws it)."""
    return os.path.join(workdir, f"{METHODS[method].get('vfm', 'dino_vitb8')}_seed0.pth")
