"""compute_cot_mask: every rule of the spec by hand, then against the naive state machine."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from reference import E, S, cot_mask_ref

from egpo.advantage import compute_cot_mask, prompt_ends_inside_think


def mask_of(rows, masks=None, starts_inside=None):
    r = torch.tensor(rows)
    m = torch.ones_like(r) if masks is None else torch.tensor(masks)
    si = None if starts_inside is None else torch.tensor(starts_inside)
    return compute_cot_mask(r, m, S, E, si).int().tolist()


@pytest.mark.parametrize(
    "row, expected",
    [
        # a span opens after <think> and closes before </think>; markers are not part of it
        ([1, S, 2, 3, E, 4], [0, 0, 1, 1, 0, 0]),
        # no marker at all: outside
        ([1, 2, 3, 4], [0, 0, 0, 0]),
        # response begins inside (first marker is </think>): inside from position 0 up to it
        ([2, 3, E, 4, 5], [1, 1, 0, 0, 0]),
        # a truncated <think> runs to the end of the response
        ([1, S, 2, 3], [0, 0, 1, 1]),
        # several spans: the union
        ([S, 1, E, 2, S, 3, E, 4], [0, 1, 0, 0, 0, 1, 0, 0]),
        # a repeated <think> inside a span does not nest: the first </think> closes it
        ([S, 1, S, 2, E, 3, E, 4], [0, 1, 0, 1, 0, 0, 0, 0]),
        # empty span
        ([S, E, 1], [0, 0, 0]),
        # a stray </think> after a closed span changes nothing
        ([S, 1, E, 2, E, 3], [0, 1, 0, 0, 0, 0]),
    ],
)
def test_hand_worked_rules(row, expected):
    assert mask_of([row]) == [expected]


def test_padding_is_never_in_the_span():
    # truncated span over a right-padded row: stops at the end of the valid response
    assert mask_of([[S, 1, 2, 0, 0]], [[1, 1, 1, 0, 0]]) == [[0, 1, 1, 0, 0]]
    # inferred-inside row with padding
    assert mask_of([[1, E, 0]], [[1, 1, 0]]) == [[1, 0, 0]]


def test_starts_inside_given_explicitly():
    rows = [[1, 2, E, 3], [1, 2, E, 3], [1, 2, 3, 4], [S, 1, E, 2]]
    # explicit False: a leading </think> is then a stray marker, nothing is inside
    assert mask_of(rows, starts_inside=[True, False, True, True]) == [
        [1, 1, 0, 0],
        [0, 0, 0, 0],
        [1, 1, 1, 1],  # inside from the prompt, never closed (truncated mid-thought)
        [0, 1, 0, 0],  # <think> while already inside does not nest
    ]


def test_markers_under_mask_zero_still_switch_state():
    # multi-turn: a turn's <think> sits in template tokens that the policy did not sample (mask 0)
    row = [[1, E, 9, 9, S, 2, 3, E, 4]]
    msk = [[1, 1, 0, 0, 0, 1, 1, 1, 1]]
    assert mask_of(row, msk) == [[1, 0, 0, 0, 0, 1, 1, 0, 0]]


def test_rows_are_independent():
    rows = [[S, 1, 2], [3, E, 4], [5, 6, 9]]
    assert mask_of(rows) == [[0, 1, 1], [1, 0, 0], [0, 0, 0]]


def test_bad_shapes_are_refused():
    r = torch.zeros(2, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="response_mask has shape"):
        compute_cot_mask(r, torch.ones(2, 4), S, E)
    with pytest.raises(ValueError, match="2-D"):
        compute_cot_mask(torch.zeros(3, dtype=torch.long), torch.ones(3), S, E)
    with pytest.raises(ValueError, match="starts_inside must have shape"):
        compute_cot_mask(r, torch.ones(2, 3), S, E, torch.ones(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="must differ"):
        compute_cot_mask(r, torch.ones(2, 3), S, S)


def test_prompt_state():
    prompts = torch.tensor(
        [
            [0, 0, 1, 2, S],  # template ends with an open <think>
            [0, S, 1, E, 2],  # closed
            [0, 0, 0, 1, 2],  # no marker
            [S, 1, E, 2, S],  # reopened
        ]
    )
    assert prompt_ends_inside_think(prompts, S, E).tolist() == [True, False, False, True]


tokens = st.sampled_from([S, E, 1, 2, 3])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.lists(tokens, min_size=1, max_size=12), st.booleans(), st.integers(0, 12)),
             min_size=1, max_size=6),
    st.booleans(),
)
def test_matches_naive_state_machine(rows, give_starts_inside):
    length = max(len(r) for r, _, _ in rows)
    toks = [r + [0] * (length - len(r)) for r, _, _ in rows]
    # valid prefix of random length, plus holes (mask-0 positions inside the response)
    masks = [[int(t < min(len(r), n + 1)) for t in range(length)] for r, _, n in rows]
    si = [b for _, b, _ in rows] if give_starts_inside else None
    expected = [cot_mask_ref(t, m, S, E, None if si is None else si[i]) for i, (t, m) in enumerate(zip(toks, masks))]
    got = compute_cot_mask(torch.tensor(toks), torch.tensor(masks), S, E, None if si is None else torch.tensor(si))
    assert got.tolist() == expected
