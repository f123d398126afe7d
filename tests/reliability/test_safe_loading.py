"""Nothing unsafe is loaded: checkpoints are safetensors, every torch.load (ours and the Trainer's
resume path) uses weights_only=True, YAML uses the safe loader, remote code stays off unless asked
for, and no shell command string is built. A source scan fails if an unsafe pattern is introduced."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from .helpers import cli_error

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("kdbench", "methods", "tasks", "results", "slurm", "benchmarks", "tests")
THIS_FILE = Path(__file__).resolve()

# (pattern, why it is unsafe)
UNSAFE = [
    (re.compile(r"\byaml\.(load|load_all|unsafe_load|full_load)\s*\("), "YAML must use yaml.safe_load"),
    (re.compile(r"\b(Unsafe|Full)?Loader\s*=\s*yaml\.(Unsafe|Full)?Loader\b|yaml\.(Unsafe|Full)Loader"),
     "YAML must use the safe loader"),
    (re.compile(r"shell\s*=\s*True"), "no shell command strings"),
    (re.compile(r"\bos\.(system|popen)\s*\("), "no shell command strings"),
    (re.compile(r"\bsubprocess\.\w+\(\s*f?[\"']"), "subprocess takes an argument list, never a command string"),
    (re.compile(r"\bpickle\.loads?\s*\("), "no pickle loading (use safetensors / JSON)"),
    (re.compile(r"(?<![\w.])(eval|exec)\s*\("), "no eval/exec of text"),
    (re.compile(r"trust_remote_code\s*=\s*True"), "remote code only when the user sets trust_remote_code=true"),
]


def _sources() -> list[Path]:
    files = []
    for folder in SCANNED:
        files += [p for p in (REPO / folder).rglob("*.py") if p.resolve() != THIS_FILE and ".venv" not in p.parts]
    return sorted(files)


def _torch_load_calls(text: str) -> list[str]:
    """The full text of every ``torch.load(...)`` call (balanced parentheses)."""
    calls = []
    for match in re.finditer(r"\btorch\.load\s*\(", text):
        depth, end = 0, match.end() - 1
        for end in range(match.end() - 1, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        calls.append(text[match.start():end + 1])
    return calls


def test_source_scan_finds_no_unsafe_loading_or_shell_strings():
    sources = _sources()
    assert len(sources) > 20, "the scan must see the code base"
    problems = []
    for path in sources:
        text = path.read_text(encoding="utf-8")
        for pattern, why in UNSAFE:
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{path.relative_to(REPO)}:{line}: {match.group(0)!r} ({why})")
        for call in _torch_load_calls(text):
            if not re.search(r"weights_only\s*=\s*True", call):
                problems.append(f"{path.relative_to(REPO)}: {call!r} (torch.load needs weights_only=True)")
    assert not problems, "\n".join(problems)


def test_the_scan_would_catch_each_pattern():
    """The scanner itself can fail: each unsafe snippet is flagged, each safe one is not."""
    unsafe = ["yaml.load(text)", "yaml.load(f, Loader=yaml.FullLoader)", "subprocess.run('ls ' + d, shell=True)",
              "os.system(cmd)", "subprocess.run(f'rm {x}')", "pickle.load(handle)", "eval(expr)",
              "from_pretrained(n, trust_remote_code=True)"]
    for snippet in unsafe:
        assert any(p.search(snippet) for p, _ in UNSAFE), snippet
    safe = ["yaml.safe_load(text)", "subprocess.run(['sacct', '-j', job])", "model.eval()",
            "trust_remote_code=config.trust_remote_code"]
    for snippet in safe:
        assert not any(p.search(snippet) for p, _ in UNSAFE), snippet
    assert _torch_load_calls("x = torch.load(path, map_location='cpu')") == ["torch.load(path, map_location='cpu')"]


def test_trust_remote_code_is_off_by_default():
    from kdbench.config import RunConfig, build_run_config

    assert RunConfig(method="kd", task="sst2", student="s").trust_remote_code is False
    assert build_run_config({"method": "kd", "task": "sst2", "student": "s"}).trust_remote_code is False


def test_remote_code_in_a_model_folder_is_not_executed(tiny_world, tmp_path, capsys):
    marker = tmp_path / "remote-code-ran"
    student = tmp_path / "evil-student"
    shutil.copytree(tiny_world.student, student)
    config = json.loads((student / "config.json").read_text())
    config.update(model_type="evil-bert", architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModelForSequenceClassification": "evil.EvilModel"})
    (student / "config.json").write_text(json.dumps(config))
    (student / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n"
                                     "from transformers import BertConfig as EvilConfig\n"
                                     "from transformers import BertForSequenceClassification as EvilModel\n")
    output = tmp_path / "runs"
    message = cli_error(tiny_world.run_args("kd", output, student=student), capsys, output)
    assert str(student) in message and "trust_remote_code=true" in message
    assert not marker.exists(), "remote code ran without trust_remote_code=true"


@pytest.fixture(scope="module")
def finished_run(tiny_world, tmp_path_factory):
    """One completed tiny kd run (checkpoints at steps 2 and 4)."""
    from kdbench.cli import main

    output = tmp_path_factory.mktemp("finished")
    assert main(tiny_world.run_args("kd", output, "keep_checkpoints=all")) == 0
    (run_dir,) = [p for p in output.iterdir() if p.is_dir()]
    return run_dir


def test_checkpoints_hold_weights_only_as_safetensors(finished_run):
    weights = [p for p in finished_run.rglob("*") if p.is_file() and p.suffix in (".bin", ".pt", ".pth", ".pkl",
                                                                                   ".safetensors")]
    pickled = sorted({p.name for p in weights if p.suffix != ".safetensors"})
    # Trainer's own resume state (optimizer/scheduler/RNG, run arguments) is pickled by torch.save;
    # it is read back with torch.load(weights_only=True) only (next test). Model weights never are.
    assert set(pickled) <= {"optimizer.pt", "scheduler.pt", "rng_state.pth", "training_args.bin"}, pickled
    assert (finished_run / "model" / "model.safetensors").is_file()
    assert list(finished_run.glob("stages/*/checkpoint-*/student/model.safetensors"))
    assert list(finished_run.glob("stages/*/checkpoint-*/extras.safetensors"))


def _resumable_copy(finished_run: Path, tmp_path: Path) -> Path:
    """The finished run, made unfinished again: a resume restarts from its last checkpoint."""
    run_dir = tmp_path / finished_run.parent.name / finished_run.name
    shutil.copytree(finished_run, run_dir)
    (run_dir / "result.json").unlink()
    for stage in run_dir.glob("stages/*"):
        (stage / "stage_done.json").unlink()
        shutil.rmtree(stage / "final")
    return run_dir


def test_resume_loads_trainer_state_with_weights_only(finished_run, tiny_world, tmp_path, monkeypatch):
    import torch

    from kdbench.cli import main

    run_dir = _resumable_copy(finished_run, tmp_path)
    seen = []
    original = torch.load

    def recording_load(*args, **kwargs):
        seen.append((Path(str(args[0])).name if args else "?", kwargs.get("weights_only")))
        return original(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    assert main(tiny_world.run_args("kd", run_dir.parent)) == 0
    names = {name for name, _ in seen}
    print(f"\n[safe-loading] torch.load calls on resume: {sorted(seen)}")
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= names
    assert all(weights_only is True for _, weights_only in seen), seen
    assert "training_args.bin" not in names


def test_corrupted_checkpoint_on_resume_is_named_and_skipped(finished_run, tiny_world, tmp_path, capsys):
    """A truncated last checkpoint is named, removed, and the run resumes from the intact earlier one
    (issue 18: it used to stop the run although an intact checkpoint existed)."""
    from kdbench.cli import main

    run_dir = _resumable_copy(finished_run, tmp_path)
    last = max(run_dir.glob("stages/*/checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    weights = last / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    capsys.readouterr()
    assert main(tiny_world.run_args("kd", run_dir.parent, "keep_checkpoints=all")) == 0
    out = capsys.readouterr().out
    assert f"checkpoint {last} is unusable (model.safetensors is truncated or corrupted" in out
    assert f"resuming from {last.parent / 'checkpoint-2'} at step 2" in out


def test_checkpoint_cut_short_by_a_kill_is_skipped(finished_run, tiny_world, tmp_path):
    """A checkpoint without its trainer_state.json (written last) was interrupted: the resume
    removes it and continues from the previous complete one instead of failing."""
    from kdbench.engine import last_complete_checkpoint

    run_dir = _resumable_copy(finished_run, tmp_path)
    (stage,) = run_dir.glob("stages/*")
    (stage / "checkpoint-4" / "trainer_state.json").unlink()
    (stage / "checkpoint-4" / "student" / "model.safetensors").write_bytes(b"partial")
    assert last_complete_checkpoint(stage) == str(stage / "checkpoint-2")
    assert not (stage / "checkpoint-4").exists()
    (stage / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2, "log_hist')  # cut short
    assert last_complete_checkpoint(stage) is None
    assert last_complete_checkpoint(stage / "missing") is None
