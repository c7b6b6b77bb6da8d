"""The module profile of ``--profile`` (``sparseclip_d2/benchmarks/stages.py``) on a model whose costs
are known: a fake clock that only the model's own code advances, so the figures are exact and do not
depend on the machine's load."""
import types

import torch
from torch import nn

from sparseclip_d2.benchmarks import stages


class _Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _Work(nn.Module):
    """A leaf that costs ``cost`` seconds of the fake clock."""

    def __init__(self, clock, cost):
        super().__init__()
        self.clock, self.cost = clock, cost

    def forward(self, x):
        self.clock.now += self.cost
        return x + 1


class _Block(nn.Module):
    """Two leaves and 0.5 s of its own work between them."""

    def __init__(self, clock):
        super().__init__()
        self.clock = clock
        self.a, self.b = _Work(clock, 1.0), _Work(clock, 2.0)

    def forward(self, x):
        x = self.a(x)
        self.clock.now += 0.5
        return self.b(x)


def test_inclusive_exclusive_and_outside_by_hand(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(stages, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    # a Sequential inside a Sequential: its outermost call is counted once in the inclusive figure
    model = nn.Sequential(_Block(clock), nn.Sequential(_Block(clock)))

    def run():
        clock.now += 0.25  # work outside any module (a window loop, say)
        model(torch.zeros(2))
        clock.now += 0.75

    prof = stages.profile_modules(run, top=0)
    assert prof["total_s"] == 8.0  # 0.25 + 2 x (1 + 0.5 + 2) + 0.75
    assert prof["outside_s"] == 1.0
    inclusive = {name: (s, n) for name, s, n in prof["inclusive"]}
    exclusive = {name: (s, n) for name, s, n in prof["exclusive"]}
    assert inclusive == {"Sequential": (7.0, 2), "_Block": (7.0, 2), "_Work": (6.0, 4)}
    assert exclusive == {"Sequential": (0.0, 2), "_Block": (1.0, 2), "_Work": (6.0, 4)}
    assert [row[0] for row in prof["exclusive"]] == ["_Work", "_Block", "Sequential"]
    assert len(stages.profile_modules(run, top=1)["inclusive"]) == 1


def test_the_hooks_are_removed_even_when_the_run_fails(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(stages, "time", types.SimpleNamespace(perf_counter=clock.perf_counter))
    registry = torch.nn.modules.module  # torch's global hook tables
    before = (len(registry._global_forward_pre_hooks), len(registry._global_forward_hooks))
    leaf = _Work(clock, 1.0)

    def bad():
        leaf(torch.zeros(1))
        raise RuntimeError("upstream failed")

    try:
        stages.profile_modules(bad)
    except RuntimeError as e:
        assert "upstream failed" in str(e)
    else:
        raise AssertionError("the run's error was swallowed")
    assert (len(registry._global_forward_pre_hooks), len(registry._global_forward_hooks)) == before


def test_the_report_names_each_sides_classes():
    from sparseclip_d2.benchmarks.report import profile_section

    prof = {"total_s": 8.0, "outside_s": 1.0, "inclusive": [["Sequential", 7.0, 2]], "exclusive": [["_Work", 6.0, 4]]}
    text = profile_section([{"method": "m", "project_profile": prof, "upstream_profile": None}, {"method": "x"}])
    assert "**m, project**: 8.00 s under hooks, 1.00 s outside any module" in text
    assert "Exclusive: _Work 6.00 s (x4)" in text and "Inclusive: Sequential 7.00 s (x2)" in text
    assert "upstream" not in text.split("## Where")[1].split("\n\n", 2)[2]
    assert profile_section([{"method": "m"}]) == ""
