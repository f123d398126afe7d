"""`kdbench report`: static HTML pages for a folder of runs, a sweep and a tuning study, read back
with an HTML parser (tables, images, loss-curve figures, failures)."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kdbench.cli import main
from kdbench.report import read_curves


class Page(HTMLParser):
    """The parts of a report page the tests look at."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}  # table id or class -> rows of cell texts
        self.figures: list[dict] = []
        self.links: list[str] = []
        self._table: str | None = None
        self._row: list[str] | None = None
        self._cell: list[str] | None = None
        self._figure: dict | None = None
        self._caption = False
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section":
            self.sections.append(attrs["id"])
        elif tag == "table":
            self._table = attrs.get("id") or attrs.get("class")
            self.tables.setdefault(self._table, [])
        elif tag == "tr" and self._table is not None:
            self._row = []
        elif tag in ("td", "th") and self._row is not None:
            self._cell = []
        elif tag == "figure":
            self._figure = {"id": attrs.get("id"), "images": [], "caption": ""}
        elif tag == "img" and self._figure is not None:
            self._figure["images"].append(attrs["src"])
        elif tag == "figcaption":
            self._caption = True
        elif tag == "a":
            self.links.append(attrs.get("href"))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None
        elif tag == "figure":
            self.figures.append(self._figure)
            self._figure = None
        elif tag == "figcaption":
            self._caption = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._caption and self._figure is not None:
            self._figure["caption"] += data


def _png(src: str) -> bytes:
    prefix = "data:image/png;base64,"
    assert src.startswith(prefix)
    data = base64.b64decode(src[len(prefix):])
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def _write_record(run_dir: Path, **fields) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"schema_version": 1, "status": "completed", "method": "kd", "task": "mrpc", "student": "teacher-3l",
              "teacher": "/models/teacher", "label": None, "seed": 1, "config": {"method_params": {}},
              "metrics": {"acc": 70.0, "f1": 80.5}, "student_params": 17_000_000, "train_seconds": 12.5}
    record.update(fields)
    (run_dir / "result.json").write_text(json.dumps(record))
    return run_dir


LOSS_LINES = [
    {"stage": "kd", "step": 10, "epoch": 0.5, "lr": 1e-4, "loss": 1.25, "ce": 0.75, "kd": 0.5},
    {"stage": "kd", "step": 20, "epoch": 1.0, "lr": 5e-5, "loss": 0.625, "ce": 0.375, "kd": 0.25},
    {"stage": "kd", "step": 20, "eval": {"acc": 70.0, "f1": 80.5}},
]


def _runs(folder: Path) -> dict[str, Path]:
    kd = _write_record(folder / "kd-mrpc-1")
    (kd / "loss_terms.jsonl").write_text("".join(json.dumps(line) + "\n" for line in LOSS_LINES) + '{"stage": "kd", "st')
    older = _write_record(folder / "kd-mrpc-2", seed=2, metrics={"acc": 72.0, "f1": 82.5})
    state = older / "stages" / "0-kd" / "checkpoint-20"
    state.mkdir(parents=True)
    (state / "trainer_state.json").write_text(json.dumps({"log_history": [
        {"step": 10, "loss": 2.0, "loss/ce": 1.5, "loss/kd": 0.5, "learning_rate": 1e-4, "stage": "kd"},
        {"step": 20, "eval_acc": 72.0, "eval_f1": 82.5, "eval_runtime": 1.0}]}))
    failed = _write_record(folder / "kd-mrpc-3", status="failed", metrics={}, seed=3,
                           error="DataError: dev.tsv line 7: unknown label 'maybe'",
                           traceback="Traceback (most recent call last):\n  ...\nDataError: dev.tsv line 7")
    return {"kd": kd, "older": older, "failed": failed}


def test_loss_curves_come_from_loss_terms_jsonl_else_from_checkpoints(tmp_path):
    runs = _runs(tmp_path)
    curves = read_curves(runs["kd"])
    assert curves.source == "loss_terms.jsonl"
    assert [(e["step"], e["ce"], e["kd"]) for e in curves.steps["kd"]] == [(10, 0.75, 0.5), (20, 0.375, 0.25)]
    assert curves.evals["kd"] == [{"step": 20, "acc": 70.0, "f1": 80.5}]  # the line cut by a kill is left out
    older = read_curves(runs["older"])
    assert older.source == "trainer_state.json"
    assert older.steps["kd"] == [{"stage": "kd", "step": 10, "epoch": None, "lr": 1e-4, "loss": 2.0, "ce": 1.5,
                                  "kd": 0.5}]
    assert older.evals["kd"] == [{"step": 20, "acc": 72.0, "f1": 82.5}]


def test_a_folder_of_runs_becomes_one_page_with_tables_plots_curves_and_failures(tmp_path, capsys):
    _runs(tmp_path / "runs")
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "report")]) == 0
    written = capsys.readouterr().out.split()
    assert written == [str(tmp_path / "report" / "index.html"), str(tmp_path / "report" / "runs-runs.html")]
    index = Page((tmp_path / "report" / "index.html").read_text())
    assert index.links == ["runs-runs.html"]
    page = Page(Path(written[1]).read_text())
    assert page.sections == ["tables", "tradeoffs", "runs", "curves", "failures"]
    # kd on teacher-3l is BERT-PKD Table 1's BERT3-KD row: published beside ours (mean ± std of seeds 1, 2).
    pkd = page.tables["pkd-table1"]
    ours = next(row for row in pkd if row[:2] == ["BERT3-KD", "ours"])
    paper = next(row for row in pkd if row[:2] == ["BERT3-KD", "paper"])
    assert ours[3] == "81.5 ± 1.4" and ours[4] == "71.0 ± 1.4" and paper[3] != "–"
    assert "cross-method" in page.tables
    runs_table = page.tables["runs"]
    assert runs_table[0][:7] == ["run", "method", "task", "student", "label", "seed", "status"]
    assert sorted(row[6] for row in runs_table[1:]) == ["completed", "completed", "failed"]
    curves = {figure["id"]: figure for figure in page.figures if figure["id"]}
    assert set(curves) == {"run-kd-mrpc-1", "run-kd-mrpc-2", "run-kd-mrpc-3"}
    _png(curves["run-kd-mrpc-1"]["images"][0])
    assert "from loss_terms.jsonl" in curves["run-kd-mrpc-1"]["caption"]
    # one epoch in all: its second half, the line at step 20 (the line at epoch 0.5 ends before it)
    assert "mean over the last epoch: kd: ce 0.375, kd 0.25 (10 steps)" in curves["run-kd-mrpc-1"]["caption"]
    assert "from trainer_state.json" in curves["run-kd-mrpc-2"]["caption"]
    assert curves["run-kd-mrpc-3"]["images"] == [] and "no loss terms logged" in curves["run-kd-mrpc-3"]["caption"]
    (failure,) = page.tables["failures"][1:]
    assert failure[:2] == ["kd-mrpc-3", "failed"] and "unknown label 'maybe'" in failure[3]
    for figure in page.figures:
        for src in figure["images"]:
            _png(src)  # every image is inline: the page is one file


def test_a_sweep_page_lists_its_cells_states_and_a_study_page_its_trials(tmp_path, capsys):
    optuna = pytest.importorskip("optuna")
    sweep = tmp_path / "all" / "sweep"
    runs = _runs(sweep)
    (sweep / "sweep.json").write_text(json.dumps({"name": "mini", "executor": "local", "runs": [
        {"name": "kd-mrpc-s1", "run_dir": str(runs["kd"])},
        {"name": "kd-mrpc-s3", "run_dir": str(runs["failed"])},
        {"name": "kd-rte-s1", "run_dir": str(sweep / "kd-rte-never")}]}))
    study_dir = tmp_path / "all" / "tune"
    study_dir.mkdir(parents=True)
    from kdbench.tuning import make_storage

    study = optuna.create_study(study_name="kd-mrpc", storage=make_storage(str(study_dir / "study.journal")),
                                direction="maximize")
    study.optimize(lambda trial: -(trial.suggest_float("alpha", 0.0, 1.0) - 0.3) ** 2
                   - 0.1 * trial.suggest_float("temperature", 1.0, 10.0), n_trials=4)

    assert main(["report", str(tmp_path / "all"), "--out", str(tmp_path / "report")]) == 0
    out = capsys.readouterr().out.split()
    assert [Path(p).name for p in out] == ["index.html", "sweep-mini.html", "study-tune.html"]
    sweep_page = Page(Path(out[1]).read_text())
    names = [row[0] for row in sweep_page.tables["runs"][1:]]
    assert sorted(names) == ["kd-mrpc-s1", "kd-mrpc-s3"]  # the manifest's names; kd-mrpc-2 is not in the sweep
    states = {row[0]: (row[1], row[3]) for row in sweep_page.tables["failures"][1:]}
    assert states == {"kd-mrpc-s3": ("failed", "DataError: dev.tsv line 7: unknown label 'maybe'"),
                      "kd-rte-s1": ("not-started", "–")}
    study_page = Page(Path(out[2]).read_text())
    assert "tuning" in study_page.sections
    trials = study_page.tables["trials"]
    assert trials[0][:5] == ["trial", "state", "value", "alpha", "temperature"]
    assert [row[1] for row in trials[1:]] == ["COMPLETE"] * 4
    best = max(study.trials, key=lambda t: t.value)
    assert f"{best.value:.2f}" in [row[2] for row in trials[1:]]
    captions = [figure["caption"] for figure in study_page.figures]
    assert "optimization history" in captions and "param importances" in captions


def test_report_of_an_empty_folder_is_an_error(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "nothing to report" in capsys.readouterr().err
