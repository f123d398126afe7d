"""``kdbench reproduce TABLE``: build the table's prerequisites, run its spec (or the chosen part of
it) with any executor, export the records and render the table, then the overview of every table's
verdicts (``verdicts.md``). ``kdbench reproduce all`` does it for every table in turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kdbench.config import ConfigError
from kdbench.reproduce.not_run import say_which_listed_cells_run
from kdbench.reproduce.overview import OVERVIEW_FILE, render_overview
from kdbench.reproduce.prerequisites import build_prerequisites, prerequisite_stages, prerequisite_stages_to_train
from kdbench.reproduce.records import export_records, plot, records_folder, render
from kdbench.reproduce.selection import (chosen_run_folders, say_which_recorded_cells_retrain,
                                         say_which_stages_retrain_elsewhere, write_selection)
from kdbench.reproduce.study import OUTPUT, SPEC_FOLDER, TABLE_ROWS, write_spec

ALL_TABLES = "all"
# Table 1 first: the other tables share its teachers and many of its cells, which it then trains once.
TABLE_ORDER = ("cross-method", *sorted(set(TABLE_ROWS) - {"cross-method"}))


def cmd_reproduce(args: Any) -> int:
    if args.table != ALL_TABLES:
        if args.table not in TABLE_ROWS:
            raise ConfigError(f"unknown reproduction table {args.table!r} (known: {ALL_TABLES}, "
                              f"{', '.join(sorted(TABLE_ROWS))})")
        return _reproduce_table(args, args.table)
    if args.records:
        raise ConfigError(f"--records {args.records!r} names one table's records folder; with {ALL_TABLES!r} each "
                          "table reads and writes its own (TABLE/records beside the specs)")
    if args.only:
        raise ConfigError(f"--only {args.only!r} chooses cells by the names of one table's spec; with {ALL_TABLES!r} "
                          "run the table that has them (kdbench reproduce TABLE --only ...)")
    failed = [table for table in TABLE_ORDER if _reproduce_table(args, table, echo=False) != 0]
    if failed:
        print(f"[kdbench reproduce] failed: {', '.join(failed)} (the other tables ran)")
        return 1
    if not (args.write_spec or args.dry_run):
        print(render_overview(Path(args.spec_dir)).read_text())
    return 0


def _reproduce_table(args: Any, table: str, echo: bool = True) -> int:
    """Run (or re-render, list, write the spec of) one table; ``echo`` prints its table and claims."""
    from kdbench.cli import main as kdbench_main
    from kdbench.sweep import load_spec

    spec_folder = Path(args.spec_dir)
    spec_path = spec_folder / f"{table}.yaml"
    if args.write_spec:
        print(write_spec(table, spec_folder))
        return 0
    records = Path(args.records) if args.records else records_folder(table, spec_folder)
    records.mkdir(parents=True, exist_ok=True)  # a table nothing has run for yet renders as "not run"
    if not args.render_only:
        sweep_options = ["--executor", args.executor, "--output", args.output]
        if args.profile:
            sweep_options += ["--profile", args.profile]
        patterns = [p.strip() for p in (args.only or "").split(",") if p.strip()]
        run_spec = chosen_spec = write_selection(spec_path, patterns, Path(args.output)) if patterns else spec_path
        stages_to_train = prerequisite_stages_to_train(table, spec_path, run_spec, Path(args.output))
        code = build_prerequisites(
            table, run_spec, Path(args.output), sweep_options, dry_run=args.dry_run,
            before_training=lambda: say_which_stages_retrain_elsewhere(table, spec_path, run_spec,
                                                                         Path(args.output), records))
        if code != 0:
            return code
        if args.missing:  # after the prerequisites: building augmented data renames the runs that read it
            run_spec = write_selection(spec_path, patterns, Path(args.output), leave_out_recorded_in=records,
                                       also_to_train=stages_to_train)
        else:
            say_which_recorded_cells_retrain(run_spec, Path(args.output), records)
        chosen_cells = load_spec(run_spec).get("cells") or []
        say_which_listed_cells_run(table, records, [cell["name"] for cell in chosen_cells])
        if args.missing and not chosen_cells:
            code = 0  # every chosen cell is recorded: nothing to train, the table is still exported and rendered
        else:
            code = kdbench_main(["sweep", str(run_spec), *sweep_options, *(["--dry-run"] if args.dry_run else [])])
        if args.dry_run:
            return code
        # after the prerequisites, as the folders of runs that read augmented data hash it
        supersede = (chosen_run_folders(table, spec_path, chosen_spec, Path(args.output))
                     if args.supersede_records and patterns else args.supersede_records)
        copied = export_records(spec_path, Path(args.output), records, supersede=supersede,
                                prerequisite_stages=prerequisite_stages(table, load_spec(spec_path),
                                                                        Path(args.output)))
        print(f"[kdbench reproduce] {len(copied)} records in {records}")
        if code != 0:
            return code
    out = render(table, records, records.parent / "table.md")
    if not args.no_plots and records.is_dir():
        plot(records, records.parent / "plots")
    if echo:
        print(out.read_text())
        print((out.parent / "claims.md").read_text())
    if echo and records.resolve() == records_folder(table, spec_folder).resolve():  # the overview reads these
        render_overview(spec_folder)
    return 0


def add_command(subparsers: Any) -> None:
    reproduce = subparsers.add_parser(
        "reproduce", help="run one table of kdbench's reproduction study (mini scale), or re-render it")
    reproduce.add_argument("table", help=f"one of: {', '.join(sorted(TABLE_ROWS))}; or {ALL_TABLES}: every table in "
                                         f"turn, table 1 first, then the overview of their verdicts ({OVERVIEW_FILE})")
    reproduce.add_argument("--executor", default="local", help="debug | local | slurm (default local)")
    reproduce.add_argument("--profile", help="cluster profile for --executor slurm")
    reproduce.add_argument("--output", default=OUTPUT,
                           help=f"runs folder (default {OUTPUT}); the files the specs read (the corpus, the SQuAD "
                                f"split, the augmented sets: about 35 MB) are built under {OUTPUT} of the folder the "
                                "command runs in, where the committed specs name them")
    reproduce.add_argument("--records", help="where records are exported and read (default: results/reproduction/TABLE/records)")
    reproduce.add_argument("--spec-dir", default=str(SPEC_FOLDER), help="folder of the generated sweep specs")
    reproduce.add_argument("--render-only", action="store_true", help="re-render the table from the records; train nothing")
    reproduce.add_argument("--write-spec", action="store_true", help="regenerate the table's sweep spec and exit")
    reproduce.add_argument("--dry-run", action="store_true", help="list the runs and their folders; train nothing")
    reproduce.add_argument("--no-plots", action="store_true", help="skip the score-vs-cost plots (plots/)")
    reproduce.add_argument("--supersede-records", action="store_true",
                           help="replace committed records of another training of the same run (e.g. a teacher "
                                "retrained on a new machine) instead of keeping them; with --only, only those of "
                                "the chosen cells and stages and of the stages they read")
    reproduce.add_argument("--only", metavar="PATTERNS",
                           help="run only the cells (or stages) whose names match these comma-separated shell "
                                "patterns, e.g. 'kd-3l-*' or '*-mrpc-s*' or 'teacher-rte' (see --dry-run for names); "
                                "every completed run of the table is still exported and rendered")
    reproduce.add_argument("--missing", action="store_true",
                           help="leave out the cells that already have a completed record in --records, e.g. to "
                                "continue a study whose records are committed on a new machine or cluster (the "
                                "stages the other cells need still run); combines with --only")
    reproduce.set_defaults(handler=cmd_reproduce)
