"""Student presets and initialisation from teacher layers."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification

from kdbench.config import ConfigError
from kdbench.plugins import STUDENTS
from kdbench.students import copy_teacher_weights, resolve_teacher_layers

TEACHER = BertConfig(vocab_size=77, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                     intermediate_size=37, max_position_embeddings=64, type_vocab_size=2)


def test_presets_have_the_papers_shapes_and_borrow_the_teachers_vocabulary():
    tiny = STUDENTS.get("tinybert-4l-312").build_config(TEACHER)
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.intermediate_size, tiny.num_attention_heads) == (
        4, 312, 1200, 12)
    assert (tiny.vocab_size, tiny.max_position_embeddings) == (77, 64)
    for name, layers in (("bert-6l-768", 6), ("bert-4l-768", 4), ("bert-3l-768", 3), ("tinybert-6l-768", 6)):
        config = STUDENTS.get(name).build_config(TEACHER)
        assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (layers, 768, 12)
    derived = STUDENTS.get("teacher-3l").build_config(TEACHER)
    assert (derived.num_hidden_layers, derived.hidden_size, derived.intermediate_size) == (3, 32, 37)


def test_teacher_layer_choices():
    assert resolve_teacher_layers("bottom", 12, 3) == [0, 1, 2]
    assert resolve_teacher_layers("every-other", 12, 6) == [0, 2, 4, 7, 9, 11]
    assert resolve_teacher_layers([5, 1], 6, 2) == [5, 1]
    with pytest.raises(ConfigError, match=r"\[6\] outside the teacher's layers 0..5"):
        resolve_teacher_layers([0, 6], 6, 2)
    with pytest.raises(ConfigError, match="lists 1 teacher layers but the student has 2"):
        resolve_teacher_layers([0], 6, 2)


def test_copy_teacher_layers_copies_the_listed_layers_and_not_the_head():
    torch.manual_seed(0)
    teacher = BertForSequenceClassification(TEACHER)
    student = BertForSequenceClassification(STUDENTS.get("teacher-3l").build_config(TEACHER))
    head_before = student.classifier.weight.clone()
    copy_teacher_weights(student, teacher, [1, 3, 5])
    for j, i in enumerate([1, 3, 5]):
        torch.testing.assert_close(student.bert.encoder.layer[j].output.dense.weight,
                                   teacher.bert.encoder.layer[i].output.dense.weight)
    torch.testing.assert_close(student.bert.embeddings.word_embeddings.weight,
                               teacher.bert.embeddings.word_embeddings.weight)
    torch.testing.assert_close(student.classifier.weight, head_before)


def test_copy_into_a_narrower_student_is_refused_with_the_fix():
    teacher = BertForSequenceClassification(TEACHER)
    narrow = BertForSequenceClassification(BertConfig(vocab_size=77, hidden_size=16, num_hidden_layers=2,
                                                      num_attention_heads=4, intermediate_size=20,
                                                      max_position_embeddings=64))
    with pytest.raises(ConfigError, match="use a student as wide as its teacher"):
        copy_teacher_weights(narrow, teacher, [0, 1])
