"""Which student layer learns from which teacher layer, for every method.

Index conventions (the same as :mod:`kdbench.features`):

- **hidden index** ``h``: position in ``Features.hidden_states``. ``0`` is the embedding output,
  ``m >= 1`` is the output of (1-based) layer ``m``. So a 1-based layer number *is* its hidden index.
- **attention index** ``a``: position in ``Features.attention_scores`` / ``attention_probs``,
  0-based: ``a = m - 1`` belongs to (1-based) layer ``m``.
- **encoder-module index** (0-based): position of a layer in the model's list of transformer
  blocks (``encoder.layer[i]``); used by the initialisation rules (:func:`distilbert_init_layers`,
  :func:`bottom_layers`). Block ``i`` produces ``hidden_states[i + 1]`` and ``attention[i]``.

Every function says which of these it returns. All functions are pure and validate their inputs
(``n_teacher``/``n_student`` positive ints, the student not deeper than the teacher) with a
``ValueError`` that names the offending values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "PKD_STRATEGIES",
    "TINYBERT_STRATEGIES",
    "LayerMapping",
    "LayerMatch",
    "bottom_layers",
    "bottom_map",
    "distilbert_init_layers",
    "explicit_map",
    "mobilebert_mapping",
    "pkd_cls_matches",
    "pkd_last_layers",
    "pkd_layers",
    "pkd_skip_layers",
    "tinybert_mapping",
    "top_map",
    "uniform_attention_map",
    "uniform_hidden_map",
    "uniform_map",
]


@dataclass(frozen=True)
class LayerMatch:
    """One student/teacher feature pair.

    ``student`` and ``teacher`` index the same kind of feature list: hidden indices when the match
    is in a hidden-state list, attention indices (0-based) when in an attention list. ``weight``
    multiplies that pair's loss (1.0 in every official recipe).
    """

    student: int
    teacher: int
    weight: float = 1.0


class LayerMapping(NamedTuple):
    """Hidden-state matches and attention matches of one strategy (unpacks as a 2-tuple)."""

    hidden: list[LayerMatch]
    attention: list[LayerMatch]


# --------------------------------------------------------------------------- helpers


def _check_sizes(n_teacher: int, n_student: int) -> None:
    for name, value in (("n_teacher", n_teacher), ("n_student", n_student)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if n_student > n_teacher:
        raise ValueError(
            f"student has more layers than the teacher (n_student={n_student} > n_teacher={n_teacher})"
        )


def _round_half_up_ratio(numerator: int, denominator: int) -> int:
    """round(numerator / denominator) with halves rounded up, in exact integer arithmetic."""
    return (2 * numerator + denominator) // (2 * denominator)


def _uniform_step(n_teacher: int, n_student: int) -> int:
    _check_sizes(n_teacher, n_student)
    if n_teacher % n_student != 0:
        raise ValueError(
            f"the uniform mapping needs n_teacher divisible by n_student, got n_teacher={n_teacher}, "
            f"n_student={n_student} ({n_teacher} % {n_student} = {n_teacher % n_student}); "
            "use 'top', 'bottom' or an explicit list of layer pairs instead"
        )
    return n_teacher // n_student


def _mapping_from_layer_function(teacher_layers: Sequence[int], *, embedding: bool) -> LayerMapping:
    """Build matches from g: student layer m (1-based) -> teacher layer teacher_layers[m-1] (1-based)."""
    hidden = [LayerMatch(0, 0)] if embedding else []
    attention = []
    for m, g in enumerate(teacher_layers, start=1):
        hidden.append(LayerMatch(m, g))
        attention.append(LayerMatch(m - 1, g - 1))
    return LayerMapping(hidden, attention)


# --------------------------------------------------------------------------- TinyBERT


def uniform_hidden_map(n_teacher: int, n_student: int) -> list[LayerMatch]:
    """TinyBERT's default (uniform) hidden-state mapping, in **hidden indices**.

    With ``k = n_teacher / n_student``: student ``hidden[j]`` ↔ teacher ``hidden[j*k]`` for
    ``j = 0..n_student`` (``j = 0`` is the embedding output, so ``n_student + 1`` matches).
    Raises ``ValueError`` unless ``n_teacher % n_student == 0`` (the official code asserts it).
    """
    k = _uniform_step(n_teacher, n_student)
    return [LayerMatch(j, j * k) for j in range(n_student + 1)]


def uniform_attention_map(n_teacher: int, n_student: int) -> list[LayerMatch]:
    """TinyBERT's default (uniform) attention mapping, in **0-based attention indices**.

    Student ``attn[i]`` ↔ teacher ``attn[i*k + k - 1]`` for ``i = 0..n_student-1``, ``k = N/M``
    (i.e. 1-based student layer ``m`` ↔ 1-based teacher layer ``m*k``, the same layers as
    :func:`uniform_hidden_map`). Raises ``ValueError`` unless ``n_teacher % n_student == 0``.
    """
    k = _uniform_step(n_teacher, n_student)
    return [LayerMatch(i, i * k + k - 1) for i in range(n_student)]


def uniform_map(n_teacher: int, n_student: int) -> LayerMapping:
    """Both uniform maps: ``(uniform_hidden_map(...), uniform_attention_map(...))``."""
    return LayerMapping(uniform_hidden_map(n_teacher, n_student), uniform_attention_map(n_teacher, n_student))


def top_map(n_teacher: int, n_student: int) -> LayerMapping:
    """TinyBERT paper's "top" strategy: 1-based student layer ``m`` ↔ teacher layer ``m + N - M``.

    Hidden matches (hidden indices): ``0 ↔ 0`` (embedding) then ``m ↔ m + N - M`` for
    ``m = 1..M``. Attention matches (0-based attention indices): ``m-1 ↔ m + N - M - 1``.
    No divisibility requirement.
    """
    _check_sizes(n_teacher, n_student)
    offset = n_teacher - n_student
    return _mapping_from_layer_function([m + offset for m in range(1, n_student + 1)], embedding=True)


def bottom_map(n_teacher: int, n_student: int) -> LayerMapping:
    """TinyBERT paper's "bottom" strategy: 1-based student layer ``m`` ↔ teacher layer ``m``.

    Hidden matches: ``0 ↔ 0`` then ``m ↔ m`` for ``m = 1..M``; attention matches ``m-1 ↔ m-1``.
    """
    _check_sizes(n_teacher, n_student)
    return _mapping_from_layer_function(list(range(1, n_student + 1)), embedding=True)


def explicit_map(pairs: Sequence[tuple[int, int]], n_teacher: int, n_student: int) -> LayerMapping:
    """A user-given mapping as ``(student_layer, teacher_layer)`` pairs of **hidden indices**.

    A pair ``(m, g)`` means 1-based student layer ``m`` learns from 1-based teacher layer ``g``;
    ``0`` denotes the embedding output. Every pair yields the hidden match ``m ↔ g``; a pair with
    both ``m >= 1`` and ``g >= 1`` also yields the attention match ``m-1 ↔ g-1`` (the embedding has
    no attention). Nothing is added implicitly: include ``(0, 0)`` to distil the embedding layer.

    Raises ``ValueError`` naming the bad pair and the valid ranges when a student index is outside
    ``0..n_student`` or a teacher index outside ``0..n_teacher``, when a pair is not two ints, when
    a pair is repeated, or when ``pairs`` is empty.
    """
    _check_sizes(n_teacher, n_student)
    pairs = list(pairs)
    if not pairs:
        raise ValueError("explicit layer mapping is empty; give at least one (student, teacher) pair")
    hidden: list[LayerMatch] = []
    attention: list[LayerMatch] = []
    seen: set[tuple[int, int]] = set()
    for pair in pairs:
        try:
            s, t = pair
        except (TypeError, ValueError):
            raise ValueError(f"layer pair {pair!r} is not a (student_layer, teacher_layer) pair") from None
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (s, t)):
            raise ValueError(f"layer pair {pair!r} must hold two ints (hidden indices)")
        if not 0 <= s <= n_student or not 0 <= t <= n_teacher:
            raise ValueError(
                f"layer pair (student={s}, teacher={t}) is out of range: student layers are "
                f"0..{n_student} and teacher layers 0..{n_teacher} (0 = embedding output, "
                "1-based transformer layers otherwise)"
            )
        if (s, t) in seen:
            raise ValueError(f"layer pair (student={s}, teacher={t}) is given twice")
        seen.add((s, t))
        hidden.append(LayerMatch(s, t))
        if s >= 1 and t >= 1:
            attention.append(LayerMatch(s - 1, t - 1))
    return LayerMapping(hidden, attention)


TINYBERT_STRATEGIES = ("uniform", "top", "bottom")


def tinybert_mapping(
    strategy: str | Sequence[int] | Sequence[tuple[int, int]], n_teacher: int, n_student: int
) -> LayerMapping:
    """Dispatch a TinyBERT layer-mapping strategy to ``(hidden_matches, attention_matches)``.

    ``strategy`` is one of:

    - ``"uniform"`` (default in the paper and code; needs ``N % M == 0``), ``"top"``, ``"bottom"``;
    - a list of ``M`` ints: the 1-based teacher layer ``g(m)`` for each student layer
      ``m = 1..M`` (the embedding pair ``0 ↔ 0`` is added, as in every TinyBERT strategy);
    - a list of ``(student_layer, teacher_layer)`` pairs, passed to :func:`explicit_map` as is.
    """
    if isinstance(strategy, str):
        if strategy == "uniform":
            return uniform_map(n_teacher, n_student)
        if strategy == "top":
            return top_map(n_teacher, n_student)
        if strategy == "bottom":
            return bottom_map(n_teacher, n_student)
        raise ValueError(
            f"unknown TinyBERT layer-mapping strategy {strategy!r}; expected one of "
            f"{TINYBERT_STRATEGIES} or an explicit list"
        )
    items = list(strategy)
    if items and all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        _check_sizes(n_teacher, n_student)
        if len(items) != n_student:
            raise ValueError(
                f"a list of teacher layers needs one entry per student layer: got {len(items)} "
                f"entries {items} for n_student={n_student}"
            )
        return explicit_map([(0, 0)] + [(m, g) for m, g in enumerate(items, start=1)], n_teacher, n_student)
    return explicit_map(items, n_teacher, n_student)


# --------------------------------------------------------------------------- MobileBERT


def mobilebert_mapping(n_teacher: int, n_student: int) -> LayerMapping:
    """MobileBERT feature-map / attention transfer pairs: uniform mapping over layers ``1..L``.

    The embedding is excluded (FMT and AT are per transformer layer). Hidden matches in hidden
    indices ``m ↔ m*k`` for ``m = 1..M``; attention matches in 0-based attention indices
    ``m-1 ↔ m*k - 1``. In the paper student and teacher have the same depth (k = 1). Needs
    ``N % M == 0``.
    """
    hidden = uniform_hidden_map(n_teacher, n_student)[1:]
    return LayerMapping(hidden, uniform_attention_map(n_teacher, n_student))


# --------------------------------------------------------------------------- DistilBERT


def distilbert_init_layers(n_teacher: int, n_student: int) -> list[int]:
    """Teacher blocks copied into the student, as **0-based encoder-module indices**.

    Rule: student block ``i`` (``i = 0..M-1``) takes teacher block ``round(i·(N-1)/(M-1))`` with
    halves rounded up (exact integer arithmetic), so the first and last teacher blocks are always
    used. For 12 → 6 this is ``[0, 2, 4, 7, 9, 11]``, the list DistilBERT's extraction script
    uses. A 1-layer student takes block ``[0]``.
    """
    _check_sizes(n_teacher, n_student)
    if n_student == 1:
        return [0]
    return [_round_half_up_ratio(i * (n_teacher - 1), n_student - 1) for i in range(n_student)]


# --------------------------------------------------------------------------- BERT-PKD

PKD_STRATEGIES = ("skip", "last")


def pkd_skip_layers(n_teacher: int, n_student: int) -> list[int]:
    """PKD-Skip: **1-based** teacher layers for student layers ``j = 1..M-1``.

    Rule: ``round(j·N/M)`` with halves rounded up, which is ``j·k`` (every ``k = N/M``-th layer)
    when ``N`` is divisible by ``M``. 12 → 6: ``[2, 4, 6, 8, 10]``; 12 → 3: ``[4, 8]``. The last
    student layer is left to the KD loss, so a 1-layer student gets ``[]``.
    """
    _check_sizes(n_teacher, n_student)
    return [_round_half_up_ratio(j * n_teacher, n_student) for j in range(1, n_student)]


def pkd_last_layers(n_teacher: int, n_student: int) -> list[int]:
    """PKD-Last: **1-based** teacher layers ``N-M+1 .. N-1`` for student layers ``j = 1..M-1``.

    12 → 6: ``[7, 8, 9, 10, 11]``; 12 → 3: ``[10, 11]``.
    """
    _check_sizes(n_teacher, n_student)
    return [j + n_teacher - n_student for j in range(1, n_student)]


def pkd_layers(strategy: str, n_teacher: int, n_student: int) -> list[int]:
    """``pkd_skip_layers`` or ``pkd_last_layers`` by name (``"skip"`` / ``"last"``); 1-based."""
    if strategy == "skip":
        return pkd_skip_layers(n_teacher, n_student)
    if strategy == "last":
        return pkd_last_layers(n_teacher, n_student)
    raise ValueError(f"unknown PKD strategy {strategy!r}; expected one of {PKD_STRATEGIES}")


def pkd_cls_matches(strategy: str, n_teacher: int, n_student: int) -> list[LayerMatch]:
    """PKD patient-loss pairs in **hidden indices** (index ``Features.cls`` / ``hidden_states``).

    Student hidden ``j`` ↔ teacher hidden ``g(j)`` for ``j = 1..M-1``; since a 1-based layer number
    is its hidden index, the teacher side equals :func:`pkd_layers`.
    """
    return [LayerMatch(j, g) for j, g in enumerate(pkd_layers(strategy, n_teacher, n_student), start=1)]


def bottom_layers(n_student: int, n_teacher: int | None = None) -> list[int]:
    """BERT-PKD student initialisation: the teacher's bottom ``M`` blocks, **0-based** module indices.

    Returns ``[0, 1, ..., n_student-1]`` (embeddings are copied as well, by the caller). When
    ``n_teacher`` is given, checks the teacher is deep enough.
    """
    if n_teacher is None:
        if isinstance(n_student, bool) or not isinstance(n_student, int) or n_student < 1:
            raise ValueError(f"n_student must be a positive int, got {n_student!r}")
    else:
        _check_sizes(n_teacher, n_student)
    return list(range(n_student))
