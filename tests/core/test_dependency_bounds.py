"""pyproject.toml's lower bounds equal the pins of .ci/minimums.txt, which .ci/verify-minimums
installs into a fresh environment and tests: a changed bound fails here until it is re-verified."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

ROOT = Path(__file__).resolve().parents[2]
STATUSES = ("verified", "implied", "declared")


def pyproject_minimums() -> dict[str, str]:
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    minimums = {}
    for requirement in dependencies:
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)(\s*,\s*<\s*[0-9.]+)?", requirement)
        assert match, f"pyproject dependency {requirement!r} needs a lower bound (name>=X[,<Y])"
        minimums[match.group(1).lower()] = match.group(2)
    return minimums


def locked_minimums() -> dict[str, tuple[str, str]]:
    locked = {}
    for line in (ROOT / ".ci" / "minimums.txt").read_text().splitlines():
        pin, _, comment = line.partition("#")
        if not pin.strip():
            continue
        name, version = pin.strip().split("==")
        status = comment.strip().split(";")[0].split(":")[0].strip()
        assert status in STATUSES, f".ci/minimums.txt: {name} needs a status ({', '.join(STATUSES)}), got {status!r}"
        locked[name.lower()] = (version, status)
    return locked


def _same_version(bound: str, pin: str) -> bool:
    """``>=5.6`` is the pin ``5.6.0``: compare release numbers padded with zeros."""
    def parts(text: str) -> list[int]:
        return [int(p) for p in text.split(".")] + [0] * (3 - len(text.split(".")))

    return parts(bound) == parts(pin)


def test_every_lower_bound_is_the_checked_in_pin():
    declared, locked = pyproject_minimums(), locked_minimums()
    assert sorted(declared) == sorted(locked), "pyproject dependencies and .ci/minimums.txt name different packages"
    different = {name: (bound, locked[name][0]) for name, bound in declared.items()
                 if not _same_version(bound, locked[name][0])}
    assert not different, (f"lower bounds changed without re-verification (pyproject, pin): {different}; "
                           "update .ci/minimums.txt and run bash .ci/verify-minimums")
    statuses = {name: status for name, (_, status) in locked.items()}
    print(f"\n[bounds] {sum(s == 'verified' for s in statuses.values())} verified, "
          f"{sum(s == 'implied' for s in statuses.values())} implied, "
          f"declared only: {sorted(n for n, s in statuses.items() if s == 'declared')}")
    assert statuses["transformers"] == "verified"  # the bound issue 20 found false


def test_the_verification_script_installs_exactly_the_pins():
    script = (ROOT / ".ci" / "verify-minimums").read_text()
    assert ".ci/minimums.txt" in script and "python3 -m venv" in script and "--system-site-packages" not in script
    assert "installed == version" in script  # fails if a later install moved a pin
