"""Student models: named shape presets, and initialisation (random, teacher layers, checkpoint).

A preset fixes the transformer's shape and borrows the vocabulary, position and segment sizes from
the teacher, so a student always speaks its teacher's tokenizer.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from transformers import BertConfig, MobileBertConfig, PretrainedConfig

from kdbench.capture import architecture_of
from kdbench.config import ConfigError

# Sizes a student must share with its teacher to read the same token ids.
SHARED_WITH_TEACHER = ("vocab_size", "max_position_embeddings", "type_vocab_size", "pad_token_id")


@dataclass(frozen=True)
class StudentPreset:
    """A named student shape. ``shape`` holds config fields; ``base`` builds the config class."""

    name: str
    description: str
    shape: dict[str, Any] = field(default_factory=dict)
    base: Callable[..., PretrainedConfig] = BertConfig
    from_teacher: bool = False  # True: the teacher's own config with ``shape`` applied on top

    def build_config(self, teacher_config: PretrainedConfig | None) -> PretrainedConfig:
        if self.from_teacher:
            if teacher_config is None:
                raise ConfigError(f"student preset {self.name!r} is derived from the teacher: give --teacher")
            config = copy.deepcopy(teacher_config)
            for key, value in self.shape.items():
                setattr(config, key, value)
            return config
        config = self.base(**self.shape)
        if teacher_config is not None:
            for key in SHARED_WITH_TEACHER:
                if getattr(teacher_config, key, None) is not None:
                    setattr(config, key, getattr(teacher_config, key))
        return config


def _bert(layers: int, hidden: int, ffn: int, heads: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "intermediate_size": ffn, "num_attention_heads": heads}


TINYBERT_4L_312 = StudentPreset("tinybert-4l-312", "TinyBERT-4: 4 layers, hidden 312, FFN 1200, 12 heads",
                                _bert(4, 312, 1200, 12))
TINYBERT_6L_768 = StudentPreset("tinybert-6l-768", "TinyBERT-6: 6 layers, hidden 768, FFN 3072, 12 heads",
                                _bert(6, 768, 3072, 12))
BERT_6L_768 = StudentPreset("bert-6l-768", "BERT-6 (DistilBERT/PKD shape): 6 layers, hidden 768, 12 heads",
                            _bert(6, 768, 3072, 12))
BERT_4L_768 = StudentPreset("bert-4l-768", "BERT-4 (PKD): 4 layers, hidden 768, 12 heads", _bert(4, 768, 3072, 12))
BERT_3L_768 = StudentPreset("bert-3l-768", "BERT-3 (PKD): 3 layers, hidden 768, 12 heads", _bert(3, 768, 3072, 12))
TEACHER_1L = StudentPreset("teacher-1l", "the teacher's architecture with 1 layer", {"num_hidden_layers": 1},
                           from_teacher=True)
TEACHER_2L = StudentPreset("teacher-2l", "the teacher's architecture with 2 layers", {"num_hidden_layers": 2},
                           from_teacher=True)
TEACHER_3L = StudentPreset("teacher-3l", "the teacher's architecture with 3 layers", {"num_hidden_layers": 3},
                           from_teacher=True)
TEACHER_4L = StudentPreset("teacher-4l", "the teacher's architecture with 4 layers", {"num_hidden_layers": 4},
                           from_teacher=True)
TEACHER_5L = StudentPreset("teacher-5l", "the teacher's architecture with 5 layers", {"num_hidden_layers": 5},
                           from_teacher=True)
TEACHER_6L = StudentPreset("teacher-6l", "the teacher's architecture with 6 layers", {"num_hidden_layers": 6},
                           from_teacher=True)

# Half the width of a 384-wide teacher (MiniLM-L6) at half its depth: the narrow student of kdbench's
# reproduction study, where TinyBERT's projection W matters (12 heads of 16, as TinyBERT-4 keeps 12).
TEACHER_3L_192 = StudentPreset("teacher-3l-192", "the teacher's architecture with 3 layers, hidden 192, FFN 768 "
                               "(half a 384-wide teacher's width)",
                               {"num_hidden_layers": 3, "hidden_size": 192, "intermediate_size": 768},
                               from_teacher=True)


# MobileBERT family (Sun et al., 2020, Table 1; shared/paper_tables/mobilebert_table1_model_settings.csv).
# ``hidden_size`` is the inter-block feature map (what FMT compares), ``intra_bottleneck_size`` the
# width inside a block (attention q/k and FFNs), ``embedding_size`` + ``trigram_input`` the
# factorised embedding (128-d lookup, kernel-3 convolution to the feature map).
def _mobilebert(layers: int, feature_map: int, intra: int, heads: int, ffn: int, num_ffn: int, *,
                embedding: int = 128, trigram: bool = True, norm: str = "no_norm", act: str = "relu",
                bottleneck_attention: bool = False) -> dict[str, Any]:
    return {"num_hidden_layers": layers, "hidden_size": feature_map, "intra_bottleneck_size": intra,
            "true_hidden_size": intra, "num_attention_heads": heads, "intermediate_size": ffn,
            "num_feedforward_networks": num_ffn, "embedding_size": embedding, "trigram_input": trigram,
            "normalization_type": norm, "hidden_act": act, "use_bottleneck": True,
            "key_query_shared_bottleneck": True, "use_bottleneck_attention": bottleneck_attention}


MOBILEBERT_24L = StudentPreset(
    "mobilebert-24l", "MobileBERT (Table 1): 24 layers, feature map 512, intra-block 128, 4 heads, 4 FFNs of 512, "
    "NoNorm, ReLU, 128-d embedding + 3-conv (paper: 25.3M; built here: 24.6M)",
    _mobilebert(24, 512, 128, 4, 512, 4), base=MobileBertConfig)
MOBILEBERT_TINY = StudentPreset(
    "mobilebert-tiny", "MobileBERT_TINY (Table 1): 24 layers, feature map 512, intra-block 128, 4 heads, 2 FFNs, "
    "attention on the bottleneck (paper: 15.1M; built here: 17.1M)",
    _mobilebert(24, 512, 128, 4, 512, 2, bottleneck_attention=True), base=MobileBertConfig)
IB_BERT_LARGE = StudentPreset(
    "ib-bert-large", "IB-BERT_LARGE teacher shape (Table 1): 24 layers, feature map 512, intra-block 1024, 4 heads, "
    "1 FFN of 4096, LayerNorm, GELU, 128-d embedding + 3-conv (paper: 293M; built here: 332M)",
    _mobilebert(24, 512, 1024, 4, 4096, 1, norm="layer_norm", act="gelu"), base=MobileBertConfig)
# Feature map 384 = the MiniLM-L6 / BERT-384 teachers: 12 heads of 16 on a 192-wide intra-block, 2 FFNs.
# Plain 384-d embeddings and LayerNorm/GELU (MobileBERT without its OPT changes) so the teacher's
# embeddings can be copied as MobileBERT's joint/progressive strategies do.
MOBILEBERT_6L_384 = StudentPreset(
    "mobilebert-6l-384", "bottleneck MobileBERT student for 384-wide teachers: 6 layers, feature map 384, "
    "intra-block 192, 12 heads, 2 FFNs of 768, 384-d embedding, LayerNorm, GELU",
    _mobilebert(6, 384, 192, 12, 768, 2, embedding=384, trigram=False, norm="layer_norm", act="gelu"),
    base=MobileBertConfig)


def every_other_layers(num_teacher_layers: int, num_student_layers: int) -> list[int]:
    """DistilBERT's spread of teacher layers (0-based): ``[0, 2, 4, 7, 9, 11]`` for 12 -> 6."""
    from kdbench.layer_maps import distilbert_init_layers

    return list(distilbert_init_layers(num_teacher_layers, num_student_layers))


def resolve_teacher_layers(choice: str | Sequence[int], num_teacher_layers: int, num_student_layers: int) -> list[int]:
    """The 0-based teacher layers copied into student layers 0..M-1."""
    if choice == "bottom":
        layers = list(range(num_student_layers))
    elif choice == "every-other":
        layers = every_other_layers(num_teacher_layers, num_student_layers)
    elif isinstance(choice, str):
        raise ConfigError(f"student_layers: unknown choice {choice!r} (bottom, every-other or a list)")
    else:
        layers = list(choice)
    if len(layers) != num_student_layers:
        raise ConfigError(
            f"student_layers: {layers} lists {len(layers)} teacher layers but the student has {num_student_layers}"
        )
    if num_student_layers > num_teacher_layers:
        raise ConfigError(f"student_layers: the student has {num_student_layers} layers, the teacher only "
                          f"{num_teacher_layers}; copy needs a student no deeper than its teacher")
    bad = [i for i in layers if not 0 <= i < num_teacher_layers]
    if bad:
        raise ConfigError(f"student_layers: {bad} outside the teacher's layers 0..{num_teacher_layers - 1}")
    return layers


def copy_teacher_weights(student: nn.Module, teacher: nn.Module, layers: Sequence[int]) -> None:
    """Initialise the student's backbone from the teacher: embeddings, pooler and the listed layers.

    Student layer ``j`` receives teacher layer ``layers[j]``. The task head is not copied, so a
    distilled student and a fine-tuned one start from the same backbone. Every copied tensor must
    have the same shape in both models.
    """
    spec = architecture_of(student)
    if architecture_of(teacher) != spec or student.config.model_type != teacher.config.model_type:
        raise ConfigError(f"student_init=teacher needs the same architecture; student is "
                          f"{student.config.model_type!r}, teacher {teacher.config.model_type!r}")
    prefix = spec.layers + "."
    teacher_state = teacher.base_model.state_dict()
    new_state = {}
    for name, tensor in student.base_model.state_dict().items():
        source = name
        if name.startswith(prefix):
            index, rest = name[len(prefix):].split(".", 1)
            source = f"{prefix}{layers[int(index)]}.{rest}"
        if source not in teacher_state:
            raise ConfigError(f"student_init=teacher: the teacher has no weight {source!r} for student {name!r}")
        if teacher_state[source].shape != tensor.shape:
            raise ConfigError(
                f"student_init=teacher: {name!r} has shape {tuple(tensor.shape)} in the student but "
                f"{tuple(teacher_state[source].shape)} in the teacher; use a student as wide as its teacher "
                "(e.g. teacher-3l) or student_init=random"
            )
        new_state[name] = teacher_state[source].detach().clone()
    student.base_model.load_state_dict(new_state)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
