"""FG-OVD evaluator: ranks, ties, medians, drop rule and mHME, with planted scores."""
import json
import math

import pytest
import torch

from sparseclip_d2.data.datasets import fgovd as fgovd_data  # noqa: F401  (registers splits)
from sparseclip_d2.evaluation.fgovd_evaluation import (
    FGOVDEvaluator,
    add_mhme,
    fgovd_metrics,
    fgovd_ranks,
    median,
)


def test_ranks_pessimistic_ties_and_misses():
    scores = torch.tensor(
        [
            [0.9, 0.1, 0.2, 0.3],  # clear first -> 1
            [0.5, 0.5, 0.1, 0.2],  # tie with one negative -> 2 (pessimistic)
            [0.1, 0.2, 0.3, 0.4],  # last -> 4
            [0.3, 0.3, 0.3, 0.3],  # all tied -> 4
            [0.3, 0.1, 0.4, 0.3],  # one above, one tie -> 3
            [float("nan")] * 4,    # unmatched -> worst rank N + 1 = 4
        ]
    )
    matched = torch.tensor([True, True, True, True, True, False])
    assert fgovd_ranks(scores, matched).tolist() == [1, 2, 4, 4, 3, 4]


def test_ranks_reject_nan_for_matched_box():
    with pytest.raises(ValueError, match="rows \\[1\\]"):
        fgovd_ranks(torch.tensor([[1.0, 0.0], [float("nan"), 0.0]]))


def test_median_odd_even_empty():
    assert median([3, 1, 2]) == 2.0
    assert median([4, 1, 3, 2]) == 2.5  # mean of the two middle ranks
    assert median([1, 1, 11, 11]) == 6.0
    assert math.isnan(median([]))


def test_metrics_exact():
    m = fgovd_metrics([1, 2, 4, 4, 3, 4], num_dropped=2, num_missed=1)
    assert m["top1"] == pytest.approx(100.0 / 6)
    assert m["mean_rank"] == pytest.approx(18 / 6)
    assert m["median_rank"] == 3.5  # sorted 1 2 3 4 4 4 -> (3 + 4) / 2
    assert (m["num_boxes"], m["num_dropped"], m["num_missed"]) == (6, 2, 1)


def _out(scores, matched, ann_ids):
    return {"fgovd": {"scores": torch.tensor(scores), "matched": torch.tensor(matched),
                      "ann_ids": torch.tensor(ann_ids)}}


def test_evaluator_process_evaluate(tmp_path):
    ev = FGOVDEvaluator("sparseclip_fgovd_hard", output_dir=str(tmp_path))
    ev.reset()
    ev.process(
        [{"image_id": 1, "fgovd_num_dropped": 1}, {"image_id": 2, "fgovd_num_dropped": 0}],
        [
            _out([[0.9, 0.1, 0.2], [0.2, 0.2, 0.1]], [True, True], [10, 11]),  # ranks 1, 2
            _out([[0.1, 0.5, 0.3]], [True], [20]),  # rank 3
        ],
    )
    ev.process([{"image_id": 3, "fgovd_num_dropped": 2}],
               [_out([[float("nan")] * 3], [False], [30])])  # miss -> rank 3
    res = ev.evaluate()["fgovd"]
    assert res["top1"] == 25.0
    assert res["mean_rank"] == pytest.approx(9 / 4)
    assert res["median_rank"] == 2.5  # 1 2 3 3
    assert (res["num_boxes"], res["num_dropped"], res["num_missed"]) == (4, 3, 1)
    assert (tmp_path / "fgovd_ranks.json").exists()
    ev.reset()
    assert math.isnan(ev.evaluate()["fgovd"]["top1"])


def test_evaluator_image_without_boxes():
    ev = FGOVDEvaluator("sparseclip_fgovd_hard")
    ev.process([{"image_id": 5, "fgovd_num_dropped": 3}],
               [{"fgovd": {"scores": torch.zeros(0, 11), "matched": torch.zeros(0, dtype=torch.bool),
                           "ann_ids": torch.zeros(0, dtype=torch.long)}}])
    res = ev.evaluate()["fgovd"]
    assert (res["num_boxes"], res["num_dropped"]) == (0, 3)


def test_add_mhme():
    res = {
        "sparseclip_fgovd_hard": {"fgovd": {"top1": 10.0}},
        "sparseclip_fgovd_medium": {"fgovd": {"top1": 20.0}},
        "sparseclip_fgovd_easy": {"fgovd": {"top1": 36.0}},
        "sparseclip_fgovd_trivial": {"fgovd": {"top1": 90.0}},
    }
    out = add_mhme(res)
    assert out["fgovd_mHME"]["fgovd"]["mHME"] == pytest.approx(22.0)
    assert "fgovd_mHME" not in res  # input untouched
    assert out["fgovd_mHME"]["fgovd"]["hard"] == 10.0
    partial = {k: v for k, v in res.items() if "easy" not in k}
    assert add_mhme(partial) == partial


def test_add_mhme_flat_results_json_layout():
    res = {
        "sparseclip_fgovd_hard": {"top1": 1.0, "mean_rank": 3.0, "num_images": 2},
        "sparseclip_fgovd_medium": {"top1": 2.0},
        "sparseclip_fgovd_easy": {"top1": 4.5},
        "config": {"MODEL": {}},
        "random_weights": True,
    }
    out = add_mhme(res)
    assert out["fgovd_mHME"] == {"mHME": 2.5, "hard": 1.0, "medium": 2.0, "easy": 4.5}
    assert out["config"] == res["config"]


def test_factory_registered():
    from sparseclip_d2.evaluation.build import build_evaluator

    ev = build_evaluator(None, "sparseclip_fgovd_transparency", None)
    assert isinstance(ev, FGOVDEvaluator)


def _distributed_worker(rank, init_file, out_file):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        ev = FGOVDEvaluator("sparseclip_fgovd_hard")
        if rank == 0:  # ranks 1, 2 and a miss (rank 3); 1 dropped
            ev.process([{"image_id": 1, "fgovd_num_dropped": 1}],
                       [_out([[0.9, 0.1, 0.2], [0.2, 0.2, 0.1]], [True, True], [10, 11])])
            ev.process([{"image_id": 3, "fgovd_num_dropped": 0}], [_out([[0.0, 0.0, 0.0]], [False], [30])])
        else:  # rank 3 and 1; 2 dropped
            ev.process([{"image_id": 2, "fgovd_num_dropped": 2}],
                       [_out([[0.1, 0.5, 0.3], [1.0, 0.0, 0.0]], [True, True], [20, 21])])
        res = ev.evaluate()
        with open(f"{out_file}.{rank}", "w") as f:
            json.dump(res, f)
    finally:
        dist.destroy_process_group()


def test_evaluator_distributed_gather(tmp_path):
    """Two gloo processes: the main one sees all boxes, the other returns {}."""
    import torch.multiprocessing as mp

    out = str(tmp_path / "res")
    mp.spawn(_distributed_worker, args=(str(tmp_path / "init"), out), nprocs=2, join=True)
    with open(out + ".0") as f:
        main = json.load(f)["fgovd"]
    with open(out + ".1") as f:
        assert json.load(f) == {}
    # ranks 1 2 3 3 1 -> sorted 1 1 2 3 3
    assert main["top1"] == 40.0 and main["mean_rank"] == 2.0 and main["median_rank"] == 2.0
    assert (main["num_boxes"], main["num_dropped"], main["num_missed"]) == (5, 3, 1)
