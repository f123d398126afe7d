"""The plug-in contract: one import surface (kdbench.api), the README's examples run as written,
heads checked at planning, extras passed into the loss, MLM masking in the core."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path

import pytest
import torch

import kdbench.api as api
from kdbench.config import ConfigError, build_run_config
from kdbench.engine import plan_run

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_blocks(section: str, language: str) -> list[str]:
    text = README.read_text()
    body = text[text.index(f"## {section}\n"):]
    body = body[:body.index("\n## ", 1)]
    return re.findall(rf"```{language}\n(.*?)```", body, flags=re.S)


def test_every_api_name_resolves_and_the_readme_imports_only_from_it():
    for name in api.__all__:
        assert getattr(api, name) is not None, name
    code = "\n".join(readme_blocks("Adding a method", "python") + readme_blocks("Adding a task", "python"))
    kdbench_imports = re.findall(r"^from (kdbench[\w.]*) import", code, flags=re.M)
    assert kdbench_imports and set(kdbench_imports) == {"kdbench.api"}


def test_the_readme_method_runs_as_written(monkeypatch, tmp_path):
    (code,) = readme_blocks("Adding a method", "python")
    (tmp_path / "readme_method.py").write_text(code)  # imported as a module, as a plug-in would be
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "readme_method", raising=False)
    module = importlib.import_module("readme_method")
    method_cls = module.CosineCLS
    with pytest.raises(ConfigError, match=r"method cosine-cls: weight: must be >= 0, got -1.0 \(a loss weight\)"):
        method_cls.from_overrides({"weight": "-1"})
    method = method_cls.from_overrides({"weight": "2"})
    from transformers import BertConfig

    from kdbench.plugins import TASKS

    student = BertConfig(hidden_size=8, num_attention_heads=2)
    teacher = BertConfig(hidden_size=12, num_attention_heads=2)
    context = api.MethodContext(task=TASKS.get("sst2").spec, student_config=student, teacher_config=teacher,
                                run=build_run_config({"method": "kd", "task": "sst2", "student": "s"}))
    extras = method.extra_modules(context)
    (stage,) = method.stages(context)
    assert stage.uses_extras
    torch.manual_seed(0)
    s_hidden, t_hidden = (torch.randn(2, 3, 8),), (torch.randn(2, 3, 12),)
    s = api.Features(logits=torch.tensor([[2.0, 0.0], [0.0, 1.0]]), hidden_states=s_hidden)
    t = api.Features(logits=torch.zeros(2, 2), hidden_states=t_hidden)
    labels = torch.tensor([0, 1])
    terms = stage.compute({"labels": labels}, s, t, extras)
    projected = extras["proj"](s_hidden[0][:, 0])
    cosine = torch.nn.functional.cosine_similarity(projected, t_hidden[0][:, 0], dim=-1)
    assert torch.allclose(terms["cls"], 2 * (1 - cosine).mean())
    assert torch.allclose(terms["task"], torch.nn.functional.cross_entropy(s.logits, labels))
    with torch.no_grad():  # the loss reads the modules it is given, not a copy kept elsewhere
        extras["proj"].weight.mul_(-1)
        extras["proj"].bias.mul_(-1)
    assert torch.allclose(stage.compute({"labels": labels}, s, t, extras)["cls"], 2 * (1 + cosine).mean())


@pytest.mark.parametrize(("method", "task", "message"), [
    ("kd", "corpus", "method kd does not support task 'corpus' (head masked-lm); it trains classification, "
                     "regression, span heads"),
    ("pkd", "squad", "method pkd does not support task 'squad' (head span)"),
    ("tinybert", "corpus", "use method 'tinybert-general'"),
    ("distilbert-pretrain", "sst2", "use method 'distilbert'"),
])
def test_unsupported_heads_fail_at_planning(method, task, message):
    config = build_run_config({"method": method, "task": task, "student": "teacher-1l", "teacher": "/no/such/model"})
    with pytest.raises(ConfigError) as error:
        plan_run(config)  # no model, no data: planning alone refuses it
    assert message in str(error.value)
    plan_run(build_run_config({"method": "tinybert", "task": "corpus", "student": "teacher-1l",
                               "teacher": "/no/such/model", "mode": "general"}))  # general mode trains on a corpus


def test_mlm_masking_lives_in_the_core_and_no_method_imports_a_task_module():
    assert api.MlmMasking.__module__ == "kdbench.masking"
    methods = Path(__file__).resolve().parents[2] / "methods"
    offenders = [p.name for p in methods.glob("*.py")
                 if re.search(r"from kdbench\.tasks\.\w+ import .*MlmMasking", p.read_text())]
    assert offenders == []
    import kdbench.tasks.corpus as corpus

    assert not hasattr(corpus, "MlmMasking")
