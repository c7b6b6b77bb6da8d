"""The agreement driver's replay of a choice upstream made (common/replay.py): a recorded linear
assignment is used only where it costs what the project's own minimiser costs (a tie, proven on
the project's cost matrix), refused otherwise; outside the driver's ``replaying`` nothing changes.
The cost matrices are hand-built, their totals added by hand."""
import pytest
from scipy.optimize import linear_sum_assignment

from sparseclip_d2.common.replay import FLOAT32_EPS, active_replay, assignment_cost_tie, replayed_assignment, replaying

# two minimisers of total 1 + 3 + 0 = 2 + 2 + 0 = 4: columns (0, 1, 2) and (1, 0, 2); every other
# assignment costs at least 1 + 9 + 9 = 19
TIED = [[1.0, 2.0, 9.0],
        [2.0, 3.0, 9.0],
        [9.0, 9.0, 0.0]]
ROWS = [0, 1, 2]


def test_two_equal_cost_assignments_are_a_tie_and_the_recorded_one_is_replayed():
    own = list(linear_sum_assignment(TIED)[1])
    other = [1, 0, 2] if own == [0, 1, 2] else [0, 1, 2]
    check = assignment_cost_tie(TIED, ROWS, own, other)
    assert check["own"] == 4.0 and check["other"] == 4.0 and check["delta"] == 0.0 and check["tie"]
    assert check["differs"] == 2
    assert check["tol"] == pytest.approx(4 * 3 * FLOAT32_EPS * 3.0)  # 3 entries per sum, the largest used 3
    with replaying({"assignment": [{"cols": other, "cost": TIED}]}) as replay:
        assert active_replay() is replay
        got = replayed_assignment("assignment", TIED, ROWS, own)
    assert got == other and active_replay() is None
    (entry,) = replay.log
    assert entry["replayed"] and entry["call"] == 1 and entry["delta"] == 0.0 and entry["cost_diff"] == 0.0
    assert replay.unused() == {}


def test_a_tie_within_float32_rounding_is_replayed_and_a_non_tie_refused():
    near = [row[:] for row in TIED]
    near[0][1] += 2 * FLOAT32_EPS  # (1, 0, 2) now costs 4 + 2.4e-7: one float32 step on an entry near 2
    assert assignment_cost_tie(near, ROWS, [0, 1, 2], [1, 0, 2])["tie"]
    # (0, 2, 1) costs 1 + 9 + 9 = 19 against 4: not a minimiser, refused, the project's own kept
    with replaying({"assignment": [[1, 0, 2], [0, 2, 1]]}) as replay:
        assert replayed_assignment("assignment", near, ROWS, [0, 1, 2]) == [1, 0, 2]
        assert replayed_assignment("assignment", TIED, ROWS, [0, 1, 2]) == [0, 1, 2]
    first, second = replay.log
    assert first["replayed"] and first["delta"] == pytest.approx(2 * FLOAT32_EPS, rel=1e-9)
    assert not second["replayed"] and second["own"] == 4.0 and second["other"] == 19.0 and second["delta"] == 15.0
    # a tolerance given by the caller: the float32 step above is then too much
    assert not assignment_cost_tie(near, ROWS, [0, 1, 2], [1, 0, 2], tol=1e-9)["tie"]


def test_outside_replaying_and_for_unrecorded_names_the_own_choice_is_kept():
    assert replayed_assignment("assignment", TIED, ROWS, [0, 1, 2]) == [0, 1, 2]
    with replaying({"other choice": [[1, 0, 2]]}) as replay:
        assert replayed_assignment("assignment", TIED, ROWS, [0, 1, 2]) == [0, 1, 2]
    assert replay.log == [] and replay.unused() == {"other choice": 1}


def test_more_calls_than_recorded_and_a_recorded_non_assignment_are_refused():
    with replaying({"assignment": [[1, 0, 2]]}):
        replayed_assignment("assignment", TIED, ROWS, [0, 1, 2])
        with pytest.raises(RuntimeError, match="call 2, but upstream made 1 such calls"):
            replayed_assignment("assignment", TIED, ROWS, [0, 1, 2])
    with pytest.raises(ValueError, match=r"recorded assignment \[0, 0, 2\] is not an assignment"):
        assignment_cost_tie(TIED, ROWS, [0, 1, 2], [0, 0, 2])


def test_a_recorded_value_is_handed_out_once_per_call_and_logged():
    from sparseclip_d2.common.replay import replayed_value

    assert replayed_value("random state") is None  # outside replaying
    with replaying({"random state": [[1, 2], [3]]}) as replay:
        assert replayed_value("random state") == [1, 2] and replayed_value("random state") == [3]
        assert replayed_value("other") is None
    assert replay.log == [dict(name="random state", call=1, replayed=True), dict(name="random state", call=2,
                                                                                 replayed=True)]
