"""Content fingerprints of a run's inputs: the data files it reads and the models it loads.

A run's folder is named by a hash of its resolved config *and* of these fingerprints, so a run is
identified by what it reads, not by where it reads it from (:func:`run_identity`):

- a data file by its size and SHA-256 (cached by path, size and modification time, so an unchanged
  file is hashed once; a rewritten file, e.g. by ``kdbench augment``, is hashed again);
- a local model folder by the SHA-256 of its weights, config and tokenizer files;
- the ``model/`` folder of a kdbench run by that run's folder name, which is itself such a hash
  (so a sweep can name the folder of a cell whose teacher is not trained yet);
- a Hub id or a student preset by its name (a Hub revision is not resolved offline).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdbench.cache_paths import FINGERPRINTS, cache_dir

# A kdbench run folder: "<method>-<task>-<12 hex digits of the identity hash>".
IDENTITY_DIGITS = 12
RUN_FOLDER = re.compile(rf"^[a-z0-9][a-z0-9_.-]*-[0-9a-f]{{{IDENTITY_DIGITS}}}$")
RUN_MODEL_FOLDER = "model"
MODEL_FILE_SUFFIXES = (".safetensors", ".bin", ".json", ".txt", ".model")
_CHUNK = 1 << 20


def fingerprint_cache_dir() -> Path:
    return cache_dir(FINGERPRINTS)


@dataclass(frozen=True)
class FileDigest:
    path: str
    size: int
    sha256: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def file_digest(path: Path | str) -> FileDigest:
    """Size and SHA-256 of a file, cached on disk by (absolute path, size, mtime)."""
    path = Path(path).expanduser().resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()[:32]
    cache_file = fingerprint_cache_dir() / f"{key}.json"
    try:
        cached = json.loads(cache_file.read_text())
        return FileDigest(str(path), stat.st_size, cached["sha256"])
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    result = FileDigest(str(path), stat.st_size, digest.hexdigest())
    try:  # best effort: a read-only cache only costs a re-hash next time
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(path), "sha256": result.sha256}))
        os.replace(tmp, cache_file)
    except OSError:
        pass
    return result


def written_as_path(name: str) -> bool:
    """A name written as a path (absolute, ``./``, ``../``, ``~``): never a Hub id or a preset."""
    return name.startswith(("/", "./", "../", "~"))


def is_path_like(name: str) -> bool:
    """A name written as a path, or an existing file/folder."""
    return written_as_path(name) or Path(name).expanduser().exists()


def canonical_path(name: str) -> str:
    """Absolute, symlinks resolved, no trailing slash: one spelling per file or folder."""
    return str(Path(name).expanduser().resolve())


def kdbench_run_of(folder: Path) -> str | None:
    """The run folder's name if ``folder`` is the ``model/`` folder of a kdbench run (existing or not)."""
    if folder.name == RUN_MODEL_FOLDER and RUN_FOLDER.match(folder.parent.name):
        return folder.parent.name
    return None


def model_fingerprint(name: str | None) -> dict[str, Any] | None:
    """What identifies a model: its kdbench run, the digest of its files, or its Hub/preset name."""
    if not name:
        return None
    if not is_path_like(name):
        return {"name": name}
    folder = Path(canonical_path(name))
    run = kdbench_run_of(folder)
    if run is not None:
        return {"kdbench_run": run}
    if not folder.exists():
        return {"path": str(folder), "missing": True}
    return content_digest(folder)


def content_digest(folder: Path) -> dict[str, Any]:
    """The SHA-256 of a model file, or of a model folder's weights, config and tokenizer files.

    A kdbench run's ``model/`` is identified by its run's name when a run is planned (its content
    may not exist yet); a record also stores this digest of what was actually read, because the
    same config trained again (another machine, library version or commit) need not give the
    same weights."""
    if folder.is_file():
        return {"sha256": file_digest(folder).sha256}
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in MODEL_FILE_SUFFIXES)
    combined = hashlib.sha256()
    for path in files:
        combined.update(f"{path.name}\0{file_digest(path).sha256}\n".encode())
    return {"sha256": combined.hexdigest(), "files": len(files)}


def local_models_read(roles: dict[str, str | None]) -> dict[str, str]:
    """``{role: sha256}`` for each model given as an existing local file or folder."""
    found = {}
    for role, name in roles.items():
        if name and is_path_like(name) and Path(name).expanduser().exists():
            found[role] = content_digest(Path(canonical_path(name)))["sha256"]
    return found


def data_fingerprint(source: Path | str) -> dict[str, Any]:
    """A data source: a file's size and digest, or a Hub dataset's descriptor as given."""
    if isinstance(source, str):
        return {"source": source}
    path = Path(source).expanduser()
    if not path.is_file():
        return {"path": canonical_path(str(path)), "missing": True}
    return file_digest(path).as_dict()


# Version of the rule that turns a run's config and inputs into its folder name. Scheme 1 hashed the
# config with its paths (the data directory, the teacher's folder): a run moved to another machine,
# data directory or output folder got a new name. ``kdbench migrate`` renames scheme-1 folders.
IDENTITY_SCHEME = 2
LOCATION_DATA_KEYS = ("data_dir", "train_file", "dev_file", "corpus")
HUB_SOURCE_PREFIX = "hub:"  # a data source read from the Hub, not a file


def run_identity(config_identity: dict[str, Any], inputs: dict[str, Any]) -> str:
    """The 12-hex-digit identity of a run: its resolved config (:meth:`RunConfig.identity`) and the
    fingerprints of what it reads, with every location left out (:func:`location_free`)."""
    config, located_inputs = location_free(config_identity, inputs)
    return identity_digest({"scheme": IDENTITY_SCHEME, "config": config, "inputs": located_inputs})


def identity_digest(payload: dict[str, Any]) -> str:
    """The first ``IDENTITY_DIGITS`` hex digits of the SHA-256 of ``payload`` as canonical JSON."""
    canonical = json.dumps(payload, sort_keys=True, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:IDENTITY_DIGITS]


def location_free(config_identity: dict[str, Any], inputs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The config and input fingerprints without the paths they were read from.

    A model given as a local folder or file is identified by its fingerprint in ``inputs`` (a
    kdbench run's name or a content digest), so its path leaves the config; a Hub id or a student
    preset stays. Data files are identified by size and digest; the data directory and local file
    paths leave the config. A file missing at planning time keeps only its base name."""
    config = json.loads(json.dumps(config_identity, default=str))
    for role, fingerprint in inputs.items():
        if role != "data" and isinstance(fingerprint, dict) and "name" not in fingerprint:
            config.pop(role, None)
    data_config = config.get("data", {})
    for key in LOCATION_DATA_KEYS:
        value = data_config.get(key)
        if isinstance(value, str) and (key == "data_dir" or not value.startswith(HUB_SOURCE_PREFIX)):
            data_config.pop(key)
    located = {role: _without_location(value) for role, value in inputs.items() if role != "data"}
    located["data"] = [_without_location(source) for source in inputs.get("data", [])]
    return config, located


def _without_location(fingerprint: Any) -> Any:
    if not isinstance(fingerprint, dict) or "path" not in fingerprint:
        return fingerprint
    if fingerprint.get("missing"):
        return {"missing": Path(fingerprint["path"]).name}
    return {key: value for key, value in fingerprint.items() if key != "path"}
