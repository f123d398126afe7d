"""Paper-style tables: the published numbers beside the numbers measured from result records.

A table is a **spec** (``results/tables/<name>.yaml``, data, not code) rendered against the
published numbers (``results/published/*.csv``) and a folder of result records
(``kdbench.records.load_records``). ``kdbench table NAME --runs DIR`` prints it as Markdown,
LaTeX, CSV or HTML; ``kdbench list tables`` names the specs (every file in ``results/tables/``).

One module per concern: :mod:`~kdbench.tables.specs` (the spec schema and loading, through the
typed :func:`kdbench.config.from_mapping`), :mod:`~kdbench.tables.published` (the papers' CSVs),
:mod:`~kdbench.tables.matching` (runs to rows), :mod:`~kdbench.tables.building` (cells, averages,
footnotes), :mod:`~kdbench.tables.plan` (why an empty cell is empty) and
:mod:`~kdbench.tables.rendering` (Markdown, LaTeX, CSV, HTML).

Spec fields
-----------
``name``, ``title``, ``description``; ``published`` (a CSV file name under ``results/published``);
``table`` (optional: keep only CSV rows of this ``table`` value); ``note`` (footnote, e.g. that the
paper reports GLUE test while runs report dev); ``columns``: a list of

* ``header`` -- column title;
* ``task``/``metric`` -- the published cell: the CSV row with ``model`` = the row's ``model`` (and
  ``setting`` = the row's ``setting`` when given), this ``task`` and this ``metric``;
* ``run`` -- the measured cell: ``"<kdbench task>/<metric name>"`` (or a list of alternatives,
  the first one a record has wins), read from the ``metric.<name>`` column of records of that task;
* ``measure`` -- instead of ``run``: a model statistic computed from the run's model config by
  :mod:`kdbench.measure` (``params_millions``, ``flops_billions``, ``speedup_x``, ...);

``average``: ``header``, ``task``/``metric`` of the printed average and ``over`` (the headers of
the columns it averages: the paper's own convention, see below); ``known_mismatches``: models whose
printed average does *not* recompute from their printed cells, each with the reason (a test checks
that exactly these rows disagree); ``relative_to``: a row key, for a paper that prints each row's
*difference* from one row rather than its average (see below); ``rows``: a list of ``key``,
``model`` (the CSV's model of the row, ``null`` for rows the paper does not have), optional
``title`` (printed instead of a long CSV model description), ``setting``, ``select`` and ``labels``;
``evaluation`` (optional): kdbench task -> which of a run's dev evaluations the cells report, where
the paper's script keeps another one than the run did (``best:<metric>``, ``last`` or ``kept``:
:mod:`kdbench.evaluations`, re-selected from each run's ``loss_terms.jsonl``; TinyBERT's ablation
tables ``{mrpc: best:acc}``, MobileBERT's ``last``). A footnote says which.

How a run becomes a row (explicit, in this order)
-------------------------------------------------
1. **Label.** A run whose ``label`` equals a row's ``key``, one of its ``labels``, its printed
   ``model`` or ``<table name>/<key>`` (case-insensitive) belongs to that row. Sweep specs should set
   ``label`` this way; it always wins.
2. **Selector.** Otherwise a row's ``select`` must match every key it names: ``method`` (the
   record's method, canonical registry name), ``student`` (the record's student preset or path),
   ``role: teacher`` (the run's model is the ``teacher`` of another run loaded alongside it),
   ``upstream`` (a nested selector the run that *produced this run's student* must match, e.g. a
   ``finetune`` of a MobileBERT knowledge-transfer student; runs are recognised by path or, after
   a move, by their run-folder name),
   ``method_params`` (each listed key equals ``config['method_params'][key]``), and any other key
   is compared with the run's config (dotted: ``train.max_seq_length``). ``select`` may be a list
   of such selectors (alternatives; the row takes a run matching any). Among the rows that match,
   the one with the **most** selector keys wins (so an ablation row ``{method: tinybert,
   method_params: {use_attn: false}}`` beats the full ``{method: tinybert}`` row); a tie between two
   rows is an error naming the run and the rows.
3. Runs matching no row are not dropped silently: the table's footnote counts them and names them.
   Failed runs never enter a cell; they are counted in a footnote too.

Cells
-----
Published cells are printed as in the paper (``†`` marks an ``uncertain`` transcription). Measured
cells: all completed runs of the row and column task; several runs with the **same seed** are a
hyper-parameter sweep, of which the best dev score is kept (the papers pick on dev); then the mean
over seeds, shown as ``mean ± std`` (sample std) when more than one seed ran. A missing cell is
``–``, never 0; given the :class:`~kdbench.tables.plan.StudyPlan` of the study the runs belong to
(``kdbench reproduce`` passes one), an empty measured cell says why it is empty instead: ``pending``,
``n/a`` or ``–`` (not in the study), each explained in a footnote, and a cell measured on fewer seeds
than planned shows ``[n/N]``. A cell whose seeds read different weights of a model they share (a
teacher or initial student trained again on another processor or library, by the records'
``weights_sha256``) is marked ``‡`` and named in a footnote with the digests: its mean mixes two
setups. A measured average uses the same ``over`` columns as the paper and exists only when every
one of them was measured.

Average conventions (checked by the tests):
TinyBERT v5 Table 1 -- mean of the 9 printed test columns (MNLI-m and -mm both, QQP F1, STS-B
Spearman, MRPC F1). TinyBERT ablations -- mean of MNLI-m, MNLI-mm, MRPC (acc) and CoLA.
DistilBERT Table 1 -- "macro-score" over the 9 printed dev columns *including WNLI* with MNLI
matched only (QQP acc, MRPC F1, STS-B Spearman). MobileBERT Table 4 -- the leaderboard GLUE score,
which is not a mean of the row (``recompute: false``: neither recomputed from the paper's cells nor
measured from ours, whose cell stays ``–``). DistilBERT Table 4 -- only each ablation's change
of the 9-task macro-score from the triple loss with teacher initialisation (``relative_to``); ours
is paired by seed: per seed, the mean over the columns both rows ran of (row - reference), then
mean ± std over seeds, with a footnote naming the columns where they are fewer than the paper's
nine. BERT-PKD tables print no average.
"""

from __future__ import annotations

from kdbench.tables.building import MISSING, UNCERTAIN_MARK, Measured, Measurer, Table, aggregate, build_table
from kdbench.tables.command import add_command, cmd_table
from kdbench.tables.matching import assign_rows
from kdbench.tables.published import (PUBLISHED_COLUMNS, PublishedValue, load_published, published_cell,
                                      recompute_averages)
from kdbench.tables.rendering import FORMATS, render
from kdbench.tables.specs import (MAIN_METRICS, AverageSpec, ColumnSpec, CrossMethodSpec, PaperAverage, RowSpec,
                                  TableError, TableSpec, load_spec, published_dir, spec_files, table_names,
                                  tables_dir)

__all__ = [
    "FORMATS", "MAIN_METRICS", "MISSING", "PUBLISHED_COLUMNS", "UNCERTAIN_MARK", "AverageSpec", "ColumnSpec",
    "CrossMethodSpec", "Measured", "Measurer", "PaperAverage", "PublishedValue", "RowSpec", "Table", "TableError",
    "TableSpec", "add_command", "aggregate", "assign_rows", "build_table", "cmd_table", "load_published",
    "load_spec", "published_cell", "published_dir", "recompute_averages", "render", "spec_files", "table_names",
    "tables_dir",
]
