"""Layer selections of every method, pinned on hand-written lists."""

from __future__ import annotations

import dataclasses

import pytest

from kdbench.layer_maps import (
    LayerMatch,
    bottom_layers,
    bottom_map,
    distilbert_init_layers,
    explicit_map,
    mobilebert_mapping,
    pkd_cls_matches,
    pkd_last_layers,
    pkd_layers,
    pkd_skip_layers,
    tinybert_mapping,
    top_map,
    uniform_attention_map,
    uniform_hidden_map,
    uniform_map,
)


def pairs(matches: list[LayerMatch]) -> list[tuple[int, int]]:
    assert all(m.weight == 1.0 for m in matches)
    return [(m.student, m.teacher) for m in matches]


# --------------------------------------------------------------------------- TinyBERT uniform

UNIFORM = {
    # (N, M): (hidden pairs, attention pairs) written out by hand
    (12, 6): (
        [(0, 0), (1, 2), (2, 4), (3, 6), (4, 8), (5, 10), (6, 12)],
        [(0, 1), (1, 3), (2, 5), (3, 7), (4, 9), (5, 11)],
    ),
    (12, 4): ([(0, 0), (1, 3), (2, 6), (3, 9), (4, 12)], [(0, 2), (1, 5), (2, 8), (3, 11)]),
    (12, 3): ([(0, 0), (1, 4), (2, 8), (3, 12)], [(0, 3), (1, 7), (2, 11)]),
    (24, 6): (
        [(0, 0), (1, 4), (2, 8), (3, 12), (4, 16), (5, 20), (6, 24)],
        [(0, 3), (1, 7), (2, 11), (3, 15), (4, 19), (5, 23)],
    ),
    (6, 3): ([(0, 0), (1, 2), (2, 4), (3, 6)], [(0, 1), (1, 3), (2, 5)]),
    (6, 2): ([(0, 0), (1, 3), (2, 6)], [(0, 2), (1, 5)]),
    (12, 12): ([(j, j) for j in range(13)], [(i, i) for i in range(12)]),
}


@pytest.mark.parametrize("n_teacher,n_student", sorted(UNIFORM))
def test_uniform_maps(n_teacher: int, n_student: int) -> None:
    hidden, attention = UNIFORM[(n_teacher, n_student)]
    assert pairs(uniform_hidden_map(n_teacher, n_student)) == hidden
    assert pairs(uniform_attention_map(n_teacher, n_student)) == attention
    h, a = uniform_map(n_teacher, n_student)
    assert pairs(h) == hidden and pairs(a) == attention
    h, a = tinybert_mapping("uniform", n_teacher, n_student)
    assert pairs(h) == hidden and pairs(a) == attention


@pytest.mark.parametrize("n_teacher,n_student", [(12, 5), (12, 8), (24, 7), (6, 4)])
def test_uniform_needs_divisibility(n_teacher: int, n_student: int) -> None:
    for fn in (uniform_hidden_map, uniform_attention_map):
        with pytest.raises(ValueError, match="divisible") as err:
            fn(n_teacher, n_student)
        assert f"n_teacher={n_teacher}" in str(err.value) and f"n_student={n_student}" in str(err.value)
    with pytest.raises(ValueError, match="divisible"):
        tinybert_mapping("uniform", n_teacher, n_student)


@pytest.mark.parametrize(
    "n_teacher,n_student", [(6, 12), (0, 0), (12, 0), (-12, 6)]
)
def test_bad_sizes(n_teacher: int, n_student: int) -> None:
    with pytest.raises(ValueError):
        uniform_hidden_map(n_teacher, n_student)
    with pytest.raises(ValueError):
        top_map(n_teacher, n_student)
    with pytest.raises(ValueError):
        pkd_skip_layers(n_teacher, n_student)
    with pytest.raises(ValueError):
        distilbert_init_layers(n_teacher, n_student)


def test_bad_size_types() -> None:
    with pytest.raises(ValueError, match="n_student"):
        bottom_map(12, 4.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="n_teacher"):
        bottom_map(True, 1)  # type: ignore[arg-type]


def test_student_deeper_than_teacher_message() -> None:
    with pytest.raises(ValueError, match=r"n_student=6 > n_teacher=3"):
        uniform_hidden_map(3, 6)


# --------------------------------------------------------------------------- TinyBERT top / bottom


def test_top_map_12_4() -> None:
    hidden, attention = top_map(12, 4)
    assert pairs(hidden) == [(0, 0), (1, 9), (2, 10), (3, 11), (4, 12)]
    assert pairs(attention) == [(0, 8), (1, 9), (2, 10), (3, 11)]


def test_top_map_12_5_no_divisibility_needed() -> None:
    hidden, attention = tinybert_mapping("top", 12, 5)
    assert pairs(hidden) == [(0, 0), (1, 8), (2, 9), (3, 10), (4, 11), (5, 12)]
    assert pairs(attention) == [(0, 7), (1, 8), (2, 9), (3, 10), (4, 11)]


def test_bottom_map_12_4() -> None:
    hidden, attention = bottom_map(12, 4)
    assert pairs(hidden) == [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
    assert pairs(attention) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    h2, a2 = tinybert_mapping("bottom", 12, 4)
    assert (h2, a2) == (hidden, attention)


# --------------------------------------------------------------------------- explicit maps


def test_explicit_map_pairs() -> None:
    hidden, attention = explicit_map([(0, 0), (1, 5), (2, 12)], n_teacher=12, n_student=2)
    assert pairs(hidden) == [(0, 0), (1, 5), (2, 12)]
    assert pairs(attention) == [(0, 4), (1, 11)]


def test_explicit_map_without_embedding() -> None:
    hidden, attention = explicit_map([(1, 3), (2, 6)], n_teacher=6, n_student=2)
    assert pairs(hidden) == [(1, 3), (2, 6)]
    assert pairs(attention) == [(0, 2), (1, 5)]


@pytest.mark.parametrize(
    "bad,fragment",
    [
        ((7, 3), "student=7, teacher=3"),
        ((2, 13), "student=2, teacher=13"),
        ((-1, 0), "student=-1, teacher=0"),
    ],
)
def test_explicit_map_out_of_range(bad: tuple[int, int], fragment: str) -> None:
    with pytest.raises(ValueError) as err:
        explicit_map([(0, 0), bad], n_teacher=12, n_student=6)
    message = str(err.value)
    assert fragment in message
    assert "0..6" in message and "0..12" in message


def test_explicit_map_other_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        explicit_map([], 12, 6)
    with pytest.raises(ValueError, match="twice"):
        explicit_map([(1, 2), (1, 2)], 12, 6)
    with pytest.raises(ValueError, match="pair"):
        explicit_map([(1, 2, 3)], 12, 6)  # type: ignore[list-item]
    with pytest.raises(ValueError, match="ints"):
        explicit_map([(1, 2.0)], 12, 6)  # type: ignore[list-item]


def test_tinybert_mapping_list_of_teacher_layers() -> None:
    hidden, attention = tinybert_mapping([3, 6, 9, 12], 12, 4)
    assert (hidden, attention) == uniform_map(12, 4)
    hidden, attention = tinybert_mapping([1, 5, 11], 12, 3)
    assert pairs(hidden) == [(0, 0), (1, 1), (2, 5), (3, 11)]
    assert pairs(attention) == [(0, 0), (1, 4), (2, 10)]
    with pytest.raises(ValueError, match="one entry per student layer"):
        tinybert_mapping([3, 6, 9], 12, 4)
    with pytest.raises(ValueError, match="teacher=13"):
        tinybert_mapping([3, 6, 9, 13], 12, 4)


def test_tinybert_mapping_list_of_pairs_and_unknown() -> None:
    hidden, attention = tinybert_mapping([(0, 0), (1, 7)], 12, 1)
    assert pairs(hidden) == [(0, 0), (1, 7)]
    assert pairs(attention) == [(0, 6)]
    with pytest.raises(ValueError, match="'middle'"):
        tinybert_mapping("middle", 12, 4)


def test_layer_match_is_frozen_with_default_weight() -> None:
    m = LayerMatch(1, 2)
    assert m.weight == 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.student = 3  # type: ignore[misc]


# --------------------------------------------------------------------------- MobileBERT


def test_mobilebert_mapping_same_depth_excludes_embedding() -> None:
    hidden, attention = mobilebert_mapping(24, 24)
    assert pairs(hidden) == [(m, m) for m in range(1, 25)]
    assert pairs(attention) == [(i, i) for i in range(24)]


def test_mobilebert_mapping_24_12() -> None:
    hidden, attention = mobilebert_mapping(24, 12)
    assert pairs(hidden) == [(m, 2 * m) for m in range(1, 13)]
    assert pairs(attention) == [(i, 2 * i + 1) for i in range(12)]


# --------------------------------------------------------------------------- DistilBERT

DISTILBERT_INIT = {
    # round-half-up of i*(N-1)/(M-1), by hand
    (12, 6): [0, 2, 4, 7, 9, 11],  # 0, 2.2, 4.4, 6.6, 8.8, 11
    (12, 4): [0, 4, 7, 11],  # 0, 3.67, 7.33, 11
    (12, 3): [0, 6, 11],  # 0, 5.5, 11
    (24, 6): [0, 5, 9, 14, 18, 23],  # 0, 4.6, 9.2, 13.8, 18.4, 23
    (6, 3): [0, 3, 5],  # 0, 2.5, 5
    (6, 2): [0, 5],
    (12, 12): list(range(12)),
    (12, 1): [0],
}


@pytest.mark.parametrize("n_teacher,n_student", sorted(DISTILBERT_INIT))
def test_distilbert_init_layers(n_teacher: int, n_student: int) -> None:
    assert distilbert_init_layers(n_teacher, n_student) == DISTILBERT_INIT[(n_teacher, n_student)]


# --------------------------------------------------------------------------- BERT-PKD

PKD = {
    # (N, M): (skip, last), 1-based teacher layers for student layers 1..M-1
    (12, 6): ([2, 4, 6, 8, 10], [7, 8, 9, 10, 11]),
    (12, 4): ([3, 6, 9], [9, 10, 11]),
    (12, 3): ([4, 8], [10, 11]),
    (24, 6): ([4, 8, 12, 16, 20], [19, 20, 21, 22, 23]),
    (6, 3): ([2, 4], [4, 5]),
    (6, 2): ([3], [5]),
    (12, 5): ([2, 5, 7, 10], [8, 9, 10, 11]),  # skip: 2.4, 4.8, 7.2, 9.6 rounded
    (12, 1): ([], []),
}


@pytest.mark.parametrize("n_teacher,n_student", sorted(PKD))
def test_pkd_layers(n_teacher: int, n_student: int) -> None:
    skip, last = PKD[(n_teacher, n_student)]
    assert pkd_skip_layers(n_teacher, n_student) == skip
    assert pkd_last_layers(n_teacher, n_student) == last
    assert pkd_layers("skip", n_teacher, n_student) == skip
    assert pkd_layers("last", n_teacher, n_student) == last
    assert pairs(pkd_cls_matches("skip", n_teacher, n_student)) == list(enumerate(skip, start=1))


@pytest.mark.parametrize("n_teacher", range(1, 25))
def test_pkd_skip_strictly_increasing_inside_teacher(n_teacher: int) -> None:
    for n_student in range(1, n_teacher + 1):
        layers = pkd_skip_layers(n_teacher, n_student)
        assert len(layers) == n_student - 1
        assert all(1 <= g <= n_teacher - 1 for g in layers)
        assert layers == sorted(set(layers))


def test_pkd_unknown_strategy() -> None:
    with pytest.raises(ValueError, match="'first'"):
        pkd_layers("first", 12, 6)


def test_bottom_layers() -> None:
    assert bottom_layers(6) == [0, 1, 2, 3, 4, 5]
    assert bottom_layers(3, n_teacher=12) == [0, 1, 2]
    with pytest.raises(ValueError, match="n_student=13 > n_teacher=12"):
        bottom_layers(13, n_teacher=12)
    with pytest.raises(ValueError, match="n_student"):
        bottom_layers(0)
