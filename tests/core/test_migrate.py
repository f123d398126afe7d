"""A run's name does not depend on where it and its inputs sit, and ``kdbench migrate`` renames
folders named under the old rule (scheme 1 hashed the data directory and the teacher's path).

``data/scheme1_records`` holds two records of the reproduction study as they were committed under
scheme 1: the RTE teacher and a KD student that read it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kdbench.cli import main
from kdbench.config import ConfigError, build_run_config, load_yaml
from kdbench.engine import plan_run
from kdbench.fingerprint import location_free, run_identity
from kdbench.migrate import (
    apply_migration,
    find_run_folders,
    older_scheme_folders,
    plan_migration,
    read_identity,
    scheme_1_identity,
)
from kdbench.records import run_lock
from tiny_models import TINY_RUN

SCHEME_1 = Path(__file__).parent / "data" / "scheme1_records"
OLD_TEACHER, OLD_STUDENT = "finetune-rte-6af5bb0a904e", "kd-rte-0b93d958f9c9"
# Their names under scheme 2, which a fresh plan of the study's spec gives on any machine.
NEW_TEACHER, NEW_STUDENT = "finetune-rte-0c0dc24bac9b", "kd-rte-e062dffbaf0b"
FAST = [f"{key}={value}" for key, value in {**TINY_RUN, "max_steps": 2, "eval_steps": 2}.items()]


def _copy_records(tmp_path: Path, *names: str) -> Path:
    root = tmp_path / "records"
    for name in names:
        shutil.copytree(SCHEME_1 / name, root / name)
    (root / "stage_roles.json").write_text(json.dumps({OLD_TEACHER: "teacher"}))
    return root


def test_the_committed_scheme_1_records_hash_to_their_names():
    for name in (OLD_TEACHER, OLD_STUDENT):
        run = read_identity(SCHEME_1 / name)
        assert name.endswith(scheme_1_identity(run.config_identity, run.inputs))
        assert not name.endswith(run_identity(run.config_identity, run.inputs))


def test_location_free_drops_paths_and_keeps_names():
    config = {"teacher": "/a/runs/finetune-rte-0123456789ab/model", "student": "teacher-3l",
              "tokenizer": "bert-base-uncased", "data": {"data_dir": "/a/data", "train_file": "/a/x.tsv",
                                                         "dev_file": "hub:glue/rte/validation", "max_train_samples": 9}}
    inputs = {"teacher": {"kdbench_run": "finetune-rte-0123456789ab"}, "tokenizer": {"name": "bert-base-uncased"},
              "data": [{"path": "/a/x.tsv", "size": 3, "sha256": "ab"}, {"path": "/a/corpus.txt", "missing": True},
                       {"source": "hub:glue/rte/validation"}]}
    located_config, located_inputs = location_free(config, inputs)
    assert located_config == {"student": "teacher-3l", "tokenizer": "bert-base-uncased",
                              "data": {"dev_file": "hub:glue/rte/validation", "max_train_samples": 9}}
    assert located_inputs == {"teacher": {"kdbench_run": "finetune-rte-0123456789ab"},
                              "tokenizer": {"name": "bert-base-uncased"},
                              "data": [{"size": 3, "sha256": "ab"}, {"missing": "corpus.txt"},
                                       {"source": "hub:glue/rte/validation"}]}
    assert config["data"]["data_dir"] == "/a/data"  # the caller's config is not changed


def test_a_run_moved_with_its_inputs_keeps_its_name(tiny_teacher, shared_data, tmp_path):
    """Teacher folder, data directory and output folder all elsewhere: the same content, the same run."""

    def configs(place: str) -> list[dict]:
        teacher = shutil.copytree(tiny_teacher, tmp_path / place / "teacher")
        shutil.copytree(shared_data / "glue_data" / "RTE", tmp_path / place / "data" / "glue_data" / "RTE")
        common = {"method": "kd", "task": "rte", "student": "teacher-1l", "data_dir": str(tmp_path / place / "data"),
                  "output": str(tmp_path / place / "runs")}
        # a teacher folder, and a kdbench run's model in that place's output folder
        upstream = tmp_path / place / "runs" / "finetune-rte-0123456789ab" / "model"
        return [{**common, "teacher": str(teacher)}, {**common, "teacher": str(upstream)}]

    a, b = configs("machine-a"), configs("machine-b")
    plans_a, plans_b = ([plan_run(build_run_config(values)) for values in place] for place in (a, b))
    assert [plan.run_dir.name for plan in plans_a] == [plan.run_dir.name for plan in plans_b]
    assert plans_a[0].run_dir.name != plans_a[1].run_dir.name and plans_a[0].run_dir != plans_b[0].run_dir
    # other content is another run
    train = tmp_path / "machine-b" / "data" / "glue_data" / "RTE" / "train.tsv"
    train.write_text(train.read_text()[:-200])
    assert plan_run(build_run_config(b[0])).run_dir.name != plans_a[0].run_dir.name


def test_migrate_renames_a_teacher_and_the_student_that_read_it(tmp_path):
    root = _copy_records(tmp_path, OLD_TEACHER, OLD_STUDENT)
    plan = plan_migration([root])
    assert plan.renames == {OLD_TEACHER: NEW_TEACHER, OLD_STUDENT: NEW_STUDENT}
    apply_migration(plan, [root])
    assert sorted(p.name for p in root.iterdir()) == sorted([NEW_TEACHER, NEW_STUDENT, "stage_roles.json"])
    record = json.loads((root / NEW_STUDENT / "result.json").read_text())
    assert record["inputs"]["teacher"] == {"kdbench_run": NEW_TEACHER}
    assert record["teacher"].endswith(f"/{NEW_TEACHER}/model") and record["run_dir"].endswith(f"/{NEW_STUDENT}")
    assert load_yaml(root / NEW_STUDENT / "config.yaml")["teacher"].endswith(f"/{NEW_TEACHER}/model")
    assert json.loads((root / "stage_roles.json").read_text()) == {NEW_TEACHER: "teacher"}
    # the metrics and weights digests are the record's own, untouched
    old = json.loads((SCHEME_1 / OLD_STUDENT / "result.json").read_text())
    assert record["metrics"] == old["metrics"] and record["weights_sha256"] == old["weights_sha256"]
    # each renamed folder hashes to its new name under the current scheme, so a second pass is a no-op
    for name in (NEW_TEACHER, NEW_STUDENT):
        run = read_identity(root / name)
        assert name.endswith(run_identity(run.config_identity, run.inputs))
    again = plan_migration([root])
    assert again.renames == {} and again.current == sorted([NEW_TEACHER, NEW_STUDENT])


def test_run_folders_inside_hidden_folders_are_not_found(tmp_path):
    root = _copy_records(tmp_path, OLD_TEACHER)
    shutil.copytree(SCHEME_1 / OLD_STUDENT, root / ".selection" / OLD_STUDENT)  # a sweep's hidden copy
    shutil.copytree(SCHEME_1 / OLD_STUDENT, root / "nested" / OLD_STUDENT)
    (root / "not-a-run").mkdir()
    (root / "not-a-run" / "config.yaml").write_text("method: kd\n")
    assert find_run_folders([root]) == [root / OLD_TEACHER, root / "nested" / OLD_STUDENT]


def test_a_student_whose_teacher_is_elsewhere_is_kept(tmp_path, capsys):
    root = _copy_records(tmp_path, OLD_STUDENT)
    assert main(["migrate", str(root)]) == 0
    assert (root / OLD_STUDENT).is_dir()
    assert f"{OLD_STUDENT}: reads run {OLD_TEACHER!r} (teacher)" in capsys.readouterr().err


def test_an_edited_record_is_not_renamed(tmp_path):
    root = _copy_records(tmp_path, OLD_TEACHER)
    path = root / OLD_TEACHER / "result.json"
    record = json.loads(path.read_text())
    record["config"]["train"]["lr"] = 1.0
    path.write_text(json.dumps(record))
    plan = plan_migration([root])
    assert plan.renames == {} and "does not hash to its name" in plan.skipped[OLD_TEACHER]


def test_dry_run_changes_nothing_and_a_live_run_blocks_the_migration(tmp_path, capsys):
    root = _copy_records(tmp_path, OLD_TEACHER, OLD_STUDENT)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    assert main(["migrate", str(root), "--dry-run"]) == 0
    assert f"rename  {OLD_TEACHER} -> {NEW_TEACHER}" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    with run_lock(root / OLD_TEACHER), pytest.raises(ConfigError, match="in use by pid"):
        apply_migration(plan_migration([root]), [root])
    assert (root / OLD_TEACHER).is_dir() and (root / OLD_STUDENT).is_dir()  # nothing renamed


def test_migrated_runs_are_found_again_by_kdbench_run(tiny_teacher, shared_data, tmp_path, capsys):
    """Two real runs (a teacher and a student that reads it) named under scheme 1, as an older
    kdbench left them: after ``kdbench migrate`` the same commands find them completed."""
    runs = tmp_path / "runs"
    teacher_args = ["run", "finetune", "--task", "rte", "--student", str(tiny_teacher), "--output", str(runs),
                    "--data-dir", str(shared_data), *FAST]
    assert main(teacher_args) == 0
    teacher_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    student_args = ["run", "kd", "--task", "rte", "--teacher", str(teacher_dir / "model"), "--student", "teacher-1l",
                    "--output", str(runs), "--data-dir", str(shared_data), *FAST]
    assert main(student_args) == 0
    student_dir = Path(capsys.readouterr().out.strip().splitlines()[-1])
    # Name both as scheme 1 did, the teacher first: the student's config and inputs then name the
    # teacher's old folder, as they did when it was planned.
    for folder in (teacher_dir, student_dir):
        run = read_identity(runs / folder.name)
        old_name = f"{run.prefix}{scheme_1_identity(run.config_identity, run.inputs)}"
        for path in runs.rglob("*"):
            if path.suffix in (".json", ".yaml") and path.is_file():
                path.write_text(path.read_text().replace(folder.name, old_name))
        (runs / folder.name).rename(runs / old_name)
    assert main(["migrate", str(runs)]) == 0
    assert sorted(p.name for p in runs.iterdir()) == sorted([teacher_dir.name, student_dir.name])
    created = json.loads((student_dir / "result.json").read_text())["created_at"]
    assert main(student_args) == 0  # found completed: not trained again
    assert Path(capsys.readouterr().out.strip().splitlines()[-1]) == student_dir
    assert json.loads((student_dir / "result.json").read_text())["created_at"] == created


def test_a_sweep_is_told_about_folders_named_by_an_older_kdbench(tmp_path):
    root = _copy_records(tmp_path, OLD_TEACHER, OLD_STUDENT)
    shutil.copytree(SCHEME_1 / OLD_TEACHER, root / "finetune-rte-0123456789ab")  # hashes to no name it has
    assert older_scheme_folders(root, []) == [OLD_TEACHER, OLD_STUDENT]
    assert older_scheme_folders(root, [OLD_STUDENT]) == [OLD_TEACHER]  # a planned name is the sweep's own
    apply_migration(plan_migration([root]), [root])
    assert older_scheme_folders(root, []) == []
