"""TinyBERT task distillation written with TextBrewer's documented API, for ``kdbench bench --workflow``.

The same job as ``kdbench run tinybert`` (mode=task): an intermediate stage (embedding + hidden-state
MSE on uniformly mapped layers through a linear projection, attention MSE on the matching layers)
then a prediction stage (soft cross-entropy on the logits, T = 1, no hard-label term; dev accuracy
after every epoch). Both stages use ``GeneralDistiller.train`` (inside ``with distiller:``, so the
student trains with dropout, as kdbench's does) with AdamW (kdbench's fused one, so
the optimiser is not what differs) and the epochs, learning rate, schedule, warm-up, betas, epsilon,
weight decay and gradient clipping kdbench resolves for the same stage (``resolve_stage``: the
method's official values, overridden by what the run gives), on batches of the same size,
dynamically padded, from the same tokenised rows, the same teacher and the same initial student.

With ``--teacher-cache`` the teacher is run once per fixed batch before each stage and its outputs
are fed in each batch's ``teacher_cache`` (TextBrewer 0.2.1's way to skip the teacher forward). Only
the mapped layers are kept (in memory, float32); the batches keep their composition across
epochs (only their order is reshuffled), since the cache belongs to a batch.

Run as ``python -m kdbench.textbrewer_workflow``; prints one JSON object (phase times) as its last line.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()
MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", required=True)
    parser.add_argument("--teacher", required=True, help="fine-tuned teacher folder")
    parser.add_argument("--student", required=True, help="initial student folder (the one kdbench also starts from)")
    parser.add_argument("--output", required=True)
    parser.add_argument("--data-dir")
    parser.add_argument("--max-train-samples", type=int)
    parser.add_argument("--max-eval-samples", type=int)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--eval-batch-size", type=int, default=64)
    parser.add_argument("--intermediate-epochs", type=int, default=20)
    parser.add_argument("--prediction-epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--teacher-cache", action="store_true", help="feed pre-computed teacher outputs")
    parser.add_argument("--length-grouped", action="store_true",
                        help="length-grouped batches (transformers' LengthGroupedSampler), as kdbench's engine uses")
    return parser.parse_args(argv)


class ShuffledBatches:
    """Fixed batches (each with its teacher outputs) in a new order every epoch."""

    def __init__(self, batches: list[dict[str, Any]], seed: int):
        self.batches, self.rng = batches, random.Random(seed)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        order = list(range(len(self.batches)))
        self.rng.shuffle(order)
        return (self.batches[i] for i in order)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from kdbench import textbrewer_job  # the TensorBoard stand-in TextBrewer 0.2.1 needs at import time

    if not textbrewer_job.available():
        raise SystemExit("textbrewer is not installed (pip install 'kdbench[bench]')")
    import torch
    from textbrewer import DistillationConfig, GeneralDistiller, TrainingConfig
    from torch.utils.data import DataLoader, RandomSampler
    from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding,
                              get_constant_schedule_with_warmup, get_linear_schedule_with_warmup)
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from kdbench.config import build_run_config
    from kdbench.engine import build_adamw, plan_run
    from kdbench.method import MethodContext
    from kdbench.optimization import resolve_stage

    phases: dict[str, float] = {"imports": round(time.perf_counter() - STARTED, 3)}
    clock = time.perf_counter()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    values = {"method": "tinybert", "task": args.task, "teacher": args.teacher, "student": args.student,
              "max_seq_length": args.max_seq_length, "output": args.output, "batch_size": args.batch_size,
              "intermediate_epochs": args.intermediate_epochs, "prediction_epochs": args.prediction_epochs}
    for key in ("max_train_samples", "max_eval_samples", "data_dir"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    config = build_run_config(values)
    plan = plan_run(config)
    task = plan.task
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    train = task.encode_train(tokenizer, config).features
    train = train.select_columns([c for c in (*MODEL_INPUTS, "labels") if c in train.column_names])
    dev = task.encode_eval(tokenizer, config)[0].features
    dev = dev.select_columns([c for c in (*MODEL_INPUTS, "labels") if c in dev.column_names])
    pad = DataCollatorWithPadding(tokenizer)

    def collate(rows: list[dict[str, Any]]) -> dict[str, Any]:
        # A plain dict: TextBrewer calls model(**batch) only for `dict` batches. No labels in training
        # batches (no hard-label term), so the models do not compute a loss of their own.
        return dict(pad(rows))

    def collate_training(rows: list[dict[str, Any]]) -> dict[str, Any]:
        return {key: value for key, value in collate(rows).items() if key in MODEL_INPUTS}
    phases["data"] = round(time.perf_counter() - clock, 3)

    clock = time.perf_counter()
    teacher = AutoModelForSequenceClassification.from_pretrained(args.teacher, attn_implementation="eager").to(device)
    student = AutoModelForSequenceClassification.from_pretrained(args.student, attn_implementation="eager").to(device)
    teacher.eval()
    phases["models"] = round(time.perf_counter() - clock, 3)
    # The optimisation kdbench resolves for each stage of the same run: the same job on both sides.
    context = MethodContext(task=task.spec, student_config=student.config, teacher_config=teacher.config, run=config)
    plan.method.extra_modules(context)
    optimization = {stage.name: resolve_stage(stage, config.train) for stage in plan.method.stages(context)}
    schedules = {"linear": get_linear_schedule_with_warmup, "constant": get_constant_schedule_with_warmup}
    n_t, n_s = teacher.config.num_hidden_layers, student.config.num_hidden_layers
    d_t, d_s = teacher.config.hidden_size, student.config.hidden_size
    step = n_t // n_s
    hidden_pairs = [(0, 0)] + [(s, s * step) for s in range(1, n_s + 1)]
    attention_pairs = [(s - 1, s * step - 1) for s in range(1, n_s + 1)]
    matches = [{"layer_T": t, "layer_S": s, "feature": "hidden", "loss": "hidden_mse", "weight": 1,
                "proj": ["linear", d_s, d_t]} for s, t in hidden_pairs]
    matches += [{"layer_T": t, "layer_S": s, "feature": "attention", "loss": "attention_mse", "weight": 1}
                for s, t in attention_pairs]

    def batches(dataset: Any, size: int, shuffle: bool) -> DataLoader:
        if not shuffle:
            return DataLoader(dataset, batch_size=size, collate_fn=collate)
        generator = torch.Generator().manual_seed(args.seed)
        sampler = (LengthGroupedSampler(size, dataset=dataset, lengths=[len(x) for x in dataset["input_ids"]],
                                        generator=generator)
                   if args.length_grouped else RandomSampler(dataset, generator=generator))
        return DataLoader(dataset, batch_size=size, sampler=sampler, collate_fn=collate_training)

    def intermediate_adaptor(batch: Any, outputs: Any) -> dict[str, Any]:
        return {"hidden": outputs["hidden_states"], "attention": outputs["attentions"]}

    def prediction_adaptor(batch: Any, outputs: Any) -> dict[str, Any]:
        return {"logits": outputs["logits"]}

    def model_batch(batch: Any) -> dict[str, Any]:
        return {key: batch[key] for key in MODEL_INPUTS if key in batch}

    def cached(loader: DataLoader, keep_hidden: list[int], keep_attention: list[int], seed: int) -> ShuffledBatches:
        """TextBrewer's teacher_cache: the teacher's outputs for each fixed batch, mapped layers only."""
        found = []
        with torch.no_grad():
            for batch in loader:
                inputs = {k: v.to(device) for k, v in model_batch(batch).items()}
                out = teacher(**inputs, output_hidden_states=bool(keep_hidden), output_attentions=bool(keep_attention))
                entry: dict[str, Any] = {"logits": out.logits}
                if keep_hidden:
                    entry["hidden_states"] = tuple(h if i in keep_hidden else None
                                                   for i, h in enumerate(out.hidden_states))
                if keep_attention:
                    entry["attentions"] = tuple(a if i in keep_attention else None for i, a in enumerate(out.attentions))
                found.append({"teacher": inputs, "student": inputs, "teacher_cache": entry})
        return ShuffledBatches(found, seed)

    def stage(name: str, distill: DistillationConfig, adaptor: Any, callback: Any, keep_hidden: list[int],
              keep_attention: list[int]) -> None:
        clock = time.perf_counter()
        opt = optimization[name]
        if opt.optimizer != "adamw" or opt.schedule not in schedules:
            raise SystemExit(f"stage {name}: optimiser {opt.optimizer!r} / schedule {opt.schedule!r} has no "
                             "TextBrewer counterpart here")
        epochs = int(opt.epochs)
        loader: Any = batches(train, args.batch_size, shuffle=True)
        if args.teacher_cache:
            loader = cached(loader, keep_hidden, keep_attention, args.seed)
            phases[f"{name}_teacher_cache"] = round(time.perf_counter() - clock, 3)
        folder = Path(args.output) / name
        folder.mkdir(parents=True, exist_ok=True)
        train_config = TrainingConfig(device=device, output_dir=str(folder), log_dir=None, ckpt_frequency=1,
                                      ckpt_epoch_frequency=1 if callback else epochs)
        distiller = GeneralDistiller(train_config, distill, teacher, student, adaptor, adaptor)
        # The usual BERT grouping (TextBrewer's examples use it too): no decay on biases and LayerNorm weights.
        named = [(n, p) for n, p in student.named_parameters() if p.requires_grad]
        groups = [{"params": [p for n, p in named if "bias" not in n and "LayerNorm" not in n]},
                  {"params": [p for n, p in named if "bias" in n or "LayerNorm" in n], "weight_decay": 0.0}]
        optimizer = build_adamw(groups, lr=opt.lr, weight_decay=opt.weight_decay, betas=(opt.beta1, opt.beta2),
                                eps=opt.eps)
        total = len(loader) * epochs
        schedule_args = {"num_warmup_steps": int(opt.warmup_ratio * total)}
        if opt.schedule == "linear":
            schedule_args["num_training_steps"] = total
        modes: set[bool] = set()  # the student's mode at every training forward (evaluation runs without grad)
        hook = student.register_forward_pre_hook(
            lambda module, inputs: modes.add(module.training) if torch.is_grad_enabled() else None)
        # `with distiller:` is TextBrewer's documented usage: it puts the student in training mode
        # (dropout on, as in kdbench and TinyBERT's code) and the teacher in eval mode. Without it a
        # student loaded by from_pretrained trains in eval mode, without dropout.
        with distiller:
            distiller.train(optimizer, loader, num_epochs=epochs, scheduler_class=schedules[opt.schedule],
                            scheduler_args=schedule_args, max_grad_norm=opt.max_grad_norm or -1.0, callback=callback,
                            output_hidden_states=bool(keep_hidden), output_attentions=bool(keep_attention))
        hook.remove()
        student_modes[name] = sorted("train" if mode else "eval" for mode in modes)
        phases[name] = round(time.perf_counter() - clock, 3)
        phases[f"{name}_optimization"] = {k: getattr(opt, k) for k in ("epochs", "lr", "schedule", "warmup_ratio",
                                                                          "weight_decay", "max_grad_norm")}

    scores: list[float] = []
    student_modes: dict[str, list[str]] = {}

    def evaluate(model: Any, step: int) -> None:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for batch in batches(dev, args.eval_batch_size, shuffle=False):
                logits = model(**{k: v.to(device) for k, v in model_batch(batch).items()}).logits
                right += int((logits.argmax(-1).cpu() == batch["labels"]).sum())
                total += len(batch["labels"])
        scores.append(round(100 * right / max(1, total), 2))
        model.train()

    stage("intermediate", DistillationConfig(intermediate_matches=matches, kd_loss_weight=0, hard_label_weight=0),
          intermediate_adaptor, None, [t for _, t in hidden_pairs], [t for _, t in attention_pairs])
    stage("prediction", DistillationConfig(temperature=1, kd_loss_type="ce", kd_loss_weight=1, hard_label_weight=0),
          prediction_adaptor, evaluate, [], [])
    phases["total_in_process"] = round(time.perf_counter() - STARTED, 3)
    print(json.dumps({"phases": phases, "dev_accuracy_per_epoch": scores, "train_rows": train.num_rows,
                      "teacher_cache": args.teacher_cache, "length_grouped": args.length_grouped,
                      "student_modes": student_modes}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
