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


def test_student_init_from_copies_another_models_layers_not_the_teachers(tiny_models, shared_data):
    """BERT-PKD/DistilBERT students start from the pre-trained model: student_init_from=MODEL copies
    its layers (here a second tiny BERT) into the preset-shaped student, while the teacher stays the
    model distilled from."""
    import torch
    from transformers import AutoTokenizer

    from kdbench.config import build_run_config
    from kdbench.engine import build_student, load_model, plan_run
    from kdbench.task import HeadType

    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_models["teacher"]), "student": "teacher-1l",
              "student_init": "teacher", "student_layers": [1], "data_dir": str(shared_data)}
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["teacher"])
    teacher = load_model(str(tiny_models["teacher"]), HeadType.CLASSIFICATION, plan_run(build_run_config(values)).task.spec,
                         trust_remote_code=False, role="teacher")
    source = load_model(str(tiny_models["student"]), HeadType.CLASSIFICATION, plan_run(build_run_config(values)).task.spec,
                        trust_remote_code=False, role="teacher")

    def first_layer(model):
        return model.bert.encoder.layer[0].attention.self.query.weight

    def source_layer(model):
        return model.bert.encoder.layer[1].attention.self.query.weight

    from_teacher = build_student(plan_run(build_run_config(values)), teacher, tokenizer)
    plan = plan_run(build_run_config({**values, "student_init_from": str(tiny_models["student"])}))
    assert plan.inputs["student_init_from"]["sha256"]  # the copied model is part of the run's identity
    from_source = build_student(plan, teacher, tokenizer)
    assert torch.equal(first_layer(from_teacher), source_layer(teacher))
    assert torch.equal(first_layer(from_source), source_layer(source))
    assert not torch.equal(first_layer(from_source), source_layer(teacher))


def test_student_init_from_needs_a_preset_student(tiny_models):
    import pytest

    from kdbench.config import ConfigError, build_run_config
    from kdbench.engine import plan_run

    with pytest.raises(ConfigError, match="student_init_from='/"):
        plan_run(build_run_config({"method": "finetune", "task": "sst2", "student": str(tiny_models["student"]),
                                   "student_init_from": str(tiny_models["teacher"])}))


def test_a_checkpoint_student_with_student_init_random_keeps_its_shape_and_not_its_weights(tiny_models, shared_data):
    """student_init=random on a checkpoint student used to load the checkpoint's weights anyway and
    record them as chosen by the run; it builds the checkpoint's architecture with new weights now."""
    from transformers import AutoTokenizer

    from kdbench.config import build_run_config
    from kdbench.engine import load_model, plan_run
    from kdbench.engine.models import build_student_with_init
    from kdbench.task import HeadType

    values = {"method": "finetune", "task": "sst2", "student": str(tiny_models["student"]), "data_dir": str(shared_data)}
    tokenizer = AutoTokenizer.from_pretrained(tiny_models["student"])
    plan = plan_run(build_run_config(values))
    checkpoint = load_model(str(tiny_models["student"]), HeadType.CLASSIFICATION, plan.task.spec,
                            trust_remote_code=False, role="student")
    loaded, how_loaded = build_student_with_init(plan, None, tokenizer)
    torch.manual_seed(0)
    random, how_random = build_student_with_init(plan_run(build_run_config({**values, "student_init": "random"})),
                                                 None, tokenizer)

    def query(model):
        return model.bert.encoder.layer[0].attention.self.query.weight

    assert torch.equal(query(loaded), query(checkpoint))
    assert (how_loaded.kind, how_loaded.chosen_by) == ("pretrained", "checkpoint student")  # auto: its weights
    assert not torch.equal(query(random), query(checkpoint))
    assert (random.config.num_hidden_layers, random.config.hidden_size, random.config.num_labels) == (
        checkpoint.config.num_hidden_layers, checkpoint.config.hidden_size, checkpoint.config.num_labels)
    assert (how_random.kind, how_random.chosen_by, how_random.source) == ("random", "run", str(tiny_models["student"]))
    # its own run folder: not the one that loads the checkpoint, nor one an older kdbench trained from it
    random_plan = plan_run(build_run_config({**values, "student_init": "random"}))
    assert random_plan.inputs["student"] == {"random_weights_of": plan.inputs["student"]}
    assert random_plan.run_dir != plan_run(build_run_config({**values, "student_init": "pretrained"})).run_dir


def test_student_init_teacher_on_a_checkpoint_student_is_refused_when_the_run_is_planned(tiny_models):
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run

    with pytest.raises(ConfigError, match=r"student_init=teacher copies teacher layers into a preset-shaped student, "
                                          r"but '.*student' is a checkpoint"):
        plan_run(build_run_config({"method": "finetune", "task": "sst2", "student": str(tiny_models["student"]),
                                   "teacher": str(tiny_models["teacher"]), "student_init": "teacher"}))


@pytest.mark.parametrize("overrides, message", [
    ({"student_init": "teacher", "student_layers": [0, 9]}, r"student_layers: \[9\] outside the teacher's layers 0..1"),
    ({"student_init": "teacher", "student_layers": [0]}, "lists 1 teacher layers but the student has 2"),
    ({"method": "pkd"}, None),  # auto -> PKD's default, teacher: layers 0..1 of a 2-layer teacher fit
    ({"student": "mobilebert-tiny", "student_init": "teacher"},
     "needs the same architecture; student is 'mobilebert', teacher 'bert'"),
    ({"student": "bert-3l-768", "student_init": "teacher", "student_layers": [0, 1, 1]},
     "copies layers of hidden_size 32 into a student of hidden_size 768"),
])
def test_the_layers_a_student_copies_are_checked_when_the_run_is_planned(tiny_models, shared_data, overrides, message):
    """--dry-run ran every plan-time check but this one: a student_layers outside the teacher failed
    only once the models had loaded."""
    from kdbench.config import build_run_config
    from kdbench.engine import plan_run
    from kdbench.engine.preflight import preflight

    values = {"method": "kd", "task": "sst2", "teacher": str(tiny_models["teacher"]), "student": "teacher-2l",
              "data_dir": str(shared_data), **overrides}
    plan = plan_run(build_run_config(values))
    if message is None:
        assert preflight(plan).student_config.num_hidden_layers == 2
    else:
        with pytest.raises(ConfigError, match=message):
            preflight(plan)
