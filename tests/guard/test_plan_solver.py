"""The planner's solver against brute force on small synthetic cost tables (no model run)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.planner import PlanInfeasibleError, parse_budget
from ckptguard.planner.memory_model import (
    FULL,
    KEEP,
    SELECTIVE,
    CostNode,
    CostTree,
    Option,
    Segment,
    evaluate,
)
from ckptguard.planner.solver import least_peak, solve

sizes = st.integers(min_value=0, max_value=60)


@st.composite
def segments(draw):
    return Segment(draw(sizes), draw(sizes), draw(sizes))


@st.composite
def options(draw):
    chosen = []
    for kind in (FULL, SELECTIVE):
        if draw(st.booleans()):
            # Integer seconds: sums are exact, so the optimum can be compared with ==.
            chosen.append(
                Option(kind, draw(sizes), draw(sizes), draw(sizes), draw(st.integers(0, 9)), 0)
            )
    return tuple(chosen)


@st.composite
def trees(draw, depth=0, counter=None):
    counter = counter if counter is not None else itertools.count()
    node = CostNode(path=f"m{next(counter)}", options=draw(options()) if depth else ())
    node.items.append(draw(segments()))
    if depth < 2:
        for _ in range(draw(st.integers(0, 3 if depth == 0 else 2))):
            node.items.append(draw(trees(depth=depth + 1, counter=counter)))
            node.items.append(draw(segments()))
    return node


def all_plans(root: CostNode):
    """Every assignment of keep / full / selective to every node (moot ones included)."""
    nodes = [n for n in root.walk() if n.options]
    for kinds in itertools.product(*[[KEEP, *(o.kind for o in n.options)] for n in nodes]):
        yield {n.path: k for n, k in zip(nodes, kinds, strict=True) if k != KEEP}


@settings(max_examples=200, deadline=None)
@given(root=trees(), top=sizes, budget=st.integers(min_value=0, max_value=400))
def test_solver_matches_brute_force(root, top, budget):
    tree = CostTree(root=root, top_need=top, unplanned_peak=0)
    outcomes = [(evaluate(tree, choices), choices) for choices in all_plans(root)]
    feasible = [o.seconds for o, _ in outcomes if o.peak_bytes <= budget]
    if not feasible:
        with pytest.raises(PlanInfeasibleError) as info:
            solve(tree, budget)
        assert info.value.minimum_bytes == min(o.peak_bytes for o, _ in outcomes)
        assert evaluate(tree, info.value.minimum_choices).peak_bytes == info.value.minimum_bytes
        return
    solution = solve(tree, budget)
    assert solution.exact
    outcome = evaluate(tree, solution.choices)
    assert outcome.peak_bytes <= budget
    assert outcome.seconds == min(feasible)


@settings(max_examples=200, deadline=None)
@given(root=trees(), top=sizes)
def test_least_peak_matches_brute_force(root, top):
    tree = CostTree(root=root, top_need=top, unplanned_peak=0)
    minimum, choices, exact = least_peak(tree)
    assert exact
    assert minimum == min(evaluate(tree, c).peak_bytes for c in all_plans(root))
    assert evaluate(tree, choices).peak_bytes == minimum


def test_nested_choice_makes_children_moot():
    child = CostNode("a.b", [Segment(10, 0, 0)], (Option(FULL, 1, 1, 11, 5, 0),))
    parent = CostNode("a", [Segment(0, 0, 0), child], (Option(FULL, 2, 2, 12, 7, 0),))
    tree = CostTree(CostNode("", [parent]), top_need=0, unplanned_peak=0)
    assert evaluate(tree, {"a": FULL}) == evaluate(tree, {"a": FULL, "a.b": FULL})
    assert evaluate(tree, {"a": FULL}).seconds == 7


def test_shared_input_is_charged_once():
    """Three siblings reading one input (q, k, v): charged once at their parent, so three full
    regions keep only their RNG-sized overhead, not three copies of the input."""
    siblings = [
        CostNode(f"attn.{n}", [Segment(4, 0, 0)], (Option(FULL, 1, 1, 5, 1, 0),)) for n in "qkv"
    ]
    items = [Segment(16, 0, 0)]  # the shared input, charged at the lowest call seeing all uses
    for sibling in siblings:
        items += [sibling, Segment(0, 0, 0)]
    tree = CostTree(CostNode("", [CostNode("attn", items)]), top_need=0, unplanned_peak=0)
    assert evaluate(tree, {}).kept_bytes == 16 + 3 * 4
    assert evaluate(tree, {s.path: FULL for s in siblings}).kept_bytes == 16 + 3 * 1


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 << 30),
        ("512MiB", 512 << 20),
        ("1.5GB", 1_500_000_000),
        ("100", 100),
        (4096, 4096),
        (0.5, 500),
    ],
)
def test_budget_parsing(text, expected):
    assert parse_budget(text, unplanned_peak=1000) == expected


@pytest.mark.parametrize("bad", ["lots", "2 parsecs", -1, 0, 1.5, 0.0, True])
def test_bad_budget_is_a_clear_error(bad):
    with pytest.raises((ValueError, TypeError), match="budget"):
        parse_budget(bad, unplanned_peak=1000)


@settings(max_examples=50, deadline=None)
@given(root=trees(), top=sizes)
def test_a_bounded_search_says_so(root, top):
    """Past ``max_states`` the searches thin their fronts: the peak found is one a plan
    reaches (never below the true least) and the result says it may not be the least."""
    tree = CostTree(root=root, top_need=top, unplanned_peak=0)
    exact_peak, _, _ = least_peak(tree)
    peak, choices, exact = least_peak(tree, max_states=1)
    assert evaluate(tree, choices).peak_bytes == peak >= exact_peak
    if not exact:
        error = PlanInfeasibleError(0, peak, choices, exact)
        assert "bounded search" in str(error) and "may be lower" in str(error)
