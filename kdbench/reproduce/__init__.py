"""kdbench's own reproduction of the four papers' findings at a scale a CPU or one GPU allows ("mini").

Every table is a sweep spec generated from the study's definition. ``kdbench reproduce TABLE``
builds the files the table's runs read, runs the spec (or the part of it chosen by name) resumably
with any executor, exports the records into ``results/reproduction/<table>/records`` and renders the
paper-style table, its claims and its plots from them. One module per job:

- :mod:`~kdbench.reproduce.study`: the mini scale, each table's rows, tasks and the claims it tests,
  and the sweep spec built from them;
- :mod:`~kdbench.reproduce.prerequisites`: the files no run produces (the GLUE corpus, the SQuAD
  split, TinyBERT's augmented sets), built before the runs that read them;
- :mod:`~kdbench.reproduce.selection`: the cells chosen by name, those already recorded, what trains
  again and on which hardware, and how long the rest takes;
- :mod:`~kdbench.reproduce.records`: exporting records and rendering tables, claims and plots;
- :mod:`~kdbench.reproduce.overview`: every table's verdicts on one page (``verdicts.md``) and the
  training behind them;
- :mod:`~kdbench.reproduce.command`: the ``kdbench reproduce`` command line.
"""

from kdbench.reproduce.command import add_command, cmd_reproduce
from kdbench.reproduce.overview import OVERVIEW_FILE, overview_text, render_overview, training_summary
from kdbench.reproduce.prerequisites import (GLUE_CORPUS, Prerequisite, PrerequisiteKind, build_prerequisites,
                                             prerequisites)
from kdbench.reproduce.records import (PAPER_TABLES, RECORD_FILES, compute_summary, export_records, paper_metrics,
                                       plot, records_folder, render, render_claims, stage_role_name)
from kdbench.reproduce.selection import (AwaitedRecord, TrainingEstimate, cells_awaiting_their_files, recorded_cells,
                                         recorded_cells_to_retrain, select_runs, stages_retrained_elsewhere,
                                         write_selection)
from kdbench.reproduce.study import (CORPUS, GD_TD_LABEL, GENERAL_DISTILLATION, GLUE_TASKS, MINI, MLM_TEACHER,
                                     NARROW_STUDENT, OUTPUT, PKT_LABEL, SPEC_FOLDER, TABLE_CLAIMS, TABLE_ROWS,
                                     TABLE_TASKS, TEACHER_MODEL, TEACHER_STAGE, WIDE_STUDENT, MiniScale, Row,
                                     TaskScale, augmented_path, build_spec, study_plan, table_tasks, teacher_stage,
                                     write_spec)

__all__ = [
    "CORPUS", "GD_TD_LABEL", "GENERAL_DISTILLATION", "GLUE_CORPUS", "GLUE_TASKS", "MINI", "MLM_TEACHER",
    "NARROW_STUDENT", "OUTPUT", "OVERVIEW_FILE", "PAPER_TABLES", "PKT_LABEL", "RECORD_FILES", "SPEC_FOLDER", "TABLE_CLAIMS",
    "TABLE_ROWS", "TABLE_TASKS", "TEACHER_MODEL", "TEACHER_STAGE", "WIDE_STUDENT", "AwaitedRecord", "MiniScale",
    "Prerequisite", "PrerequisiteKind", "Row", "TaskScale", "TrainingEstimate", "add_command", "augmented_path",
    "build_prerequisites", "build_spec", "cells_awaiting_their_files", "cmd_reproduce", "compute_summary",
    "export_records", "overview_text", "paper_metrics", "plot", "prerequisites", "recorded_cells", "recorded_cells_to_retrain",
    "records_folder", "render", "render_claims", "render_overview", "select_runs", "stage_role_name", "stages_retrained_elsewhere",
    "study_plan", "table_tasks", "teacher_stage", "training_summary", "write_selection", "write_spec",
]
