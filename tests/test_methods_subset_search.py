"""The layer-subset search (pathtwt.compress.methods.subset) on a synthetic fidelity
landscape with planted interactions (super-additive deletion costs), where ranking
single-layer deletions fails."""

from __future__ import annotations

import itertools

import pytest

from pathtwt.compress.methods.subset import (
    BudgetedScorer,
    local_search,
    random_search,
    rank_single_deletions,
    subset_boundaries,
)
from pathtwt.errors import ConfigError

# ---------------------------------------------------------------------------- subset search

L, K = 12, 6
# single-deletion costs: six cheap layers (2, 3, 5, 6, 8, 10), six expensive ones
COST = [3.0, 2.2, 0.10, 0.12, 1.5, 0.20, 0.22, 1.4, 0.30, 1.6, 0.35, 2.8]
# planted super-additive interactions: deleting both layers of a pair costs this much more
PAIRS = {(2, 3): 2.0, (5, 6): 1.5}


def landscape(subset: tuple[int, ...]) -> float:
    """Fidelity of keeping ``subset``: minus the deletion costs of the dropped layers."""
    dropped = set(range(L)) - set(subset)
    return -sum(COST[d] for d in dropped) - sum(p for (a, b), p in PAIRS.items() if a in dropped and b in dropped)


def brute_force_best() -> tuple[int, ...]:
    return max(itertools.combinations(range(L), K), key=landscape)


def test_ranking_single_deletions_falls_into_the_planted_interactions():
    ranked = rank_single_deletions(L, K, landscape)
    assert ranked == (0, 1, 4, 7, 9, 11)  # drops all six cheap layers, so both pairs
    assert landscape(ranked) < landscape(brute_force_best()) - 0.9


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_local_search_finds_the_best_subset_within_its_budget(seed):
    budget = 36  # of C(12, 6) = 924 subsets
    calls: list[tuple[int, ...]] = []

    def counted(subset):
        calls.append(subset)
        return landscape(subset)

    result = local_search(L, K, counted, budget=budget, seed=seed)
    assert result.best == brute_force_best() == (0, 1, 3, 6, 9, 11)
    assert result.best_score == pytest.approx(landscape(result.best))
    assert result.evaluations <= budget and len(calls) == len(set(calls)) == result.evaluations
    assert [s for s, _ in result.trace] == calls


def test_random_search_is_a_budgeted_control():
    result = random_search(L, K, landscape, budget=36, seed=0)
    assert result.evaluations == 36
    assert all(len(s) == K and list(s) == sorted(s) for s, _ in result.trace)
    assert result.best_score == max(v for _, v in result.trace)
    # on this landscape the control does not reach the optimum with the same budget
    assert result.best_score < landscape(brute_force_best())
    assert random_search(L, K, landscape, budget=36, seed=0).trace == result.trace  # seeded


def test_budgeted_scorer_caches_and_stops():
    scorer = BudgetedScorer(landscape, budget=2)
    scorer((0, 1, 2, 3, 4, 5))
    scorer((5, 4, 3, 2, 1, 0))  # same subset: cached, not paid for
    scorer((0, 1, 2, 3, 4, 6))
    assert len(scorer.cache) == 2
    from pathtwt.compress.methods.subset import BudgetExhausted

    with pytest.raises(BudgetExhausted):
        scorer((0, 1, 2, 3, 4, 7))


def test_subset_boundaries_and_depth_check():
    assert subset_boundaries((0, 3, 7), 12) == [3, 7, 12]  # layers 1, 4, 8 stand for 1-3, 4-7, 8-12
    with pytest.raises(ConfigError):
        local_search(12, 12, landscape, budget=5)


NEAR_TIES = '''
import json, sys
import torch
sys.path.insert(0, sys.argv[2])
from tiny_teacher import tiny_calibration, tiny_teacher
from pathtwt.compress import ranks
from pathtwt.compress.methods import common, subset
from pathtwt.compress.pipeline import CompressOptions
import pathtwt.compress.distill as loop

ranks.init_from_env("cpu", 0.2)
me, distilled, paired = ranks.rank(), [], []

def short_run(student, teacher, tiles, *, objective, **kwargs):
    # a candidate's short distillation is data-parallel: one collective every rank must share
    distilled.append(list(objective.boundaries))
    mine = torch.tensor([float(sum(b * 31 ** i for i, b in enumerate(objective.boundaries)))], dtype=torch.float64)
    paired.append(float(ranks.all_mean(mine)) == float(mine))

def near_tie(student, teacher, calib, options):
    # every candidate scores the same, to the last bits that differ per GPU on rank 1
    return 0.5 + (1e-12 * ((len(distilled) * 7919) % 13 - 6) if me == 1 else 0.0)

loop.distill, common.select_r2 = short_run, near_tie
options = CompressOptions.from_flat(out=sys.argv[1], depth=3, steps=2, batch_size=4, progress=False,
                                    extra={"search_budget": 13, "search_steps": 1})
teacher, calib = tiny_teacher(2), tiny_calibration()
record = subset.run_search(teacher, calib, options, subset.search_settings(teacher, calib, options, 2))
ranks.shutdown()
print(json.dumps({"distilled": distilled, "paired": paired, "record": record}))
'''


def test_near_tied_scores_on_two_ranks_make_one_decision(tmp_path):
    """Two gloo ranks search together; rank 1's scores differ from rank 0's in the last bits.
    Every rank distils the same candidates, in the same order, each with the other (the
    short runs' collectives pair up), and they keep the same choice."""
    import json
    from pathlib import Path

    from rank_faults import two_gloo_ranks

    script = tmp_path / "near_ties.py"
    script.write_text(NEAR_TIES.replace("sys.argv[1]", repr(str(tmp_path))).replace(
        "sys.argv[2]", repr(str(Path(__file__).parent))))
    runs = two_gloo_ranks(script, timeout=90)
    assert [code for code, _, _ in runs] == [0, 0], runs[0][2][-1500:] + runs[1][2][-1500:]
    ours, theirs = (json.loads(out.strip().splitlines()[-1]) for _, out, _ in runs)
    assert ours["distilled"] == theirs["distilled"] and len(ours["distilled"]) > 1
    assert all(ours["paired"]) and all(theirs["paired"])
    assert ours["record"] == theirs["record"]
