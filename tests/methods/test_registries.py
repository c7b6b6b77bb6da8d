"""Everything the detectron2 layer looks up by name is an fvcore ``Registry`` (the style of
detectron2's ``META_ARCH_REGISTRY`` and of the attention registries), and unknown names
get an error that lists the valid ones."""
import pytest
from fvcore.common.registry import Registry

import sparseclip_d2  # noqa: F401  (registers everything)
from conftest import register_sem_seg


def _register(name, evaluator_type):
    from detectron2.data import DatasetCatalog, MetadataCatalog

    if name in DatasetCatalog.list():
        DatasetCatalog.remove(name)
        MetadataCatalog.remove(name)
    DatasetCatalog.register(name, lambda: [])
    if evaluator_type is not None:
        MetadataCatalog.get(name).set(stuff_classes=["a"], ignore_label=255, evaluator_type=evaluator_type)


def test_lookups_are_fvcore_registries_keyed_by_name():
    from sparseclip_d2.data import TEST_LOADER_REGISTRY
    from sparseclip_d2.data.mapper import RESIZE_MODES, RESIZE_REGISTRY
    from sparseclip_d2.evaluation import EVALUATOR_REGISTRY, SUMMARY_HOOK_REGISTRY

    for reg in (TEST_LOADER_REGISTRY, EVALUATOR_REGISTRY, SUMMARY_HOOK_REGISTRY, RESIZE_REGISTRY):
        assert isinstance(reg, Registry)
    assert sorted(n for n, _ in TEST_LOADER_REGISTRY) == ["fgovd", "sem_seg"]
    assert sorted(n for n, _ in EVALUATOR_REGISTRY) == ["fgovd", "sem_seg"]
    assert [n for n, _ in SUMMARY_HOOK_REGISTRY] == ["fgovd_mhme"]
    assert RESIZE_MODES == ("detectron2", "mmseg")
    assert TEST_LOADER_REGISTRY.get("sem_seg").meta_architectures == ("SparseCLIP",)
    assert TEST_LOADER_REGISTRY.get("fgovd").meta_architectures == ("SparseCLIPFGOVD",)


def test_unknown_evaluator_type_names_the_registered_ones():
    from sparseclip_d2.data import build_test_loader, check_meta_architecture
    from sparseclip_d2.evaluation import build_evaluator

    _register("registry_odd_type", "panoptic")
    with pytest.raises(ValueError, match=r"no evaluator for evaluator_type 'panoptic' of dataset "
                                         r"'registry_odd_type'; registered: fgovd, sem_seg"):
        build_evaluator(None, "registry_odd_type", None)
    with pytest.raises(ValueError, match=r"no test loader for evaluator_type 'panoptic'.*registered: fgovd, sem_seg"):
        build_test_loader(None, "registry_odd_type", [])
    with pytest.raises(ValueError, match=r"no test loader for evaluator_type 'panoptic'"):
        check_meta_architecture("SparseCLIP", ["registry_odd_type"])
    check_meta_architecture("SomeoneElsesArch", ["registry_odd_type"])  # not ours: let through
    _register("registry_no_type", None)
    with pytest.raises(ValueError, match="'registry_no_type' has no evaluator_type"):
        build_evaluator(None, "registry_no_type", None)


def test_wrong_meta_architecture_is_named():
    from sparseclip_d2.data import check_meta_architecture

    register_sem_seg("registry_seg", [], ["a"])
    with pytest.raises(ValueError, match=r"'registry_seg' \(evaluator_type 'sem_seg'\) is evaluated with "
                                         r"MODEL.META_ARCHITECTURE SparseCLIP, not SparseCLIPFGOVD"):
        check_meta_architecture("SparseCLIPFGOVD", ["registry_seg"])
    check_meta_architecture("SparseCLIP", ["registry_seg"])


def test_a_new_task_is_one_registered_function(tmp_path):
    """Registering a loader and an evaluator under a new evaluator_type makes build_* use them;
    a second registration under the same name is refused by the registry."""
    from detectron2.evaluation import DatasetEvaluator

    from sparseclip_d2.data import TEST_LOADER_REGISTRY, build_test_loader, consumed_by
    from sparseclip_d2.evaluation import EVALUATOR_REGISTRY, build_evaluator, finalize_summaries
    from sparseclip_d2.evaluation.results import SUMMARY_HOOK_REGISTRY

    class Ev(DatasetEvaluator):
        pass

    def registry_test_task(cfg, name, x):
        return ("loader", name, x)

    def registry_test_task_ev(cfg, name, out):
        return Ev()

    registry_test_task_ev.__name__ = "registry_test_task"
    if "registry_test_task" not in TEST_LOADER_REGISTRY:
        TEST_LOADER_REGISTRY.register(consumed_by("RegistryArch")(registry_test_task))
        EVALUATOR_REGISTRY.register(registry_test_task_ev)
    _register("registry_new_task", "registry_test_task")
    assert build_test_loader(None, "registry_new_task", [1]) == ("loader", "registry_new_task", [1])
    assert isinstance(build_evaluator(None, "registry_new_task", None), Ev)
    with pytest.raises(AssertionError, match="already registered"):
        TEST_LOADER_REGISTRY.register(registry_test_task)
    assert finalize_summaries({"x": {"mIoU": 1.0}}) == {"x": {"mIoU": 1.0}}  # mHME hook: no FG-OVD split
    assert "fgovd_mhme" in SUMMARY_HOOK_REGISTRY


def test_unknown_resize_mode_lists_the_valid_ones():
    from sparseclip_d2.data.mapper import build_resize

    with pytest.raises(ValueError, match="unknown INPUT.RESIZE_MODE 'pil'; valid: detectron2, mmseg"):
        build_resize("pil", 10, 20)
    assert build_resize("mmseg", 0, 20) == []
    assert type(build_resize("detectron2", 10, 20)[0]).__name__ == "ResizeShortestEdge"
    assert type(build_resize("mmseg", 10, 20)[0]).__name__ == "MMSegRescale"
