"""Each layout string, exit code and activity-id form of the run home's contract is spelled in contracts/ only:
a scan of engine/, workflows/, ctl/, tinyllm/ and simulator/ (tests/contracts/stray_scan.py) finds none, so a
new one fails here, naming its file and line (replace it with what contracts/ offers)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import stray_scan  # this folder's helper (tests/ has no packages)

# (file, what): why it is not the contract's spelling. Kept strict: an entry nobody needs fails the last test.
ALLOWED = {
    (
        "simulator/mutants.py",
        "activity id formatted by hand ('eval-'...)",
    ): "a mutant of the workflow: its evaluation id drops the suite on purpose, which the simulator must catch",
}


def test_no_stray_spelling_of_the_contract_outside_contracts() -> None:
    found = [
        f"{f}:{line}: {what}"
        for f, items in stray_scan.scan().items()
        for line, what in items
        if (f, what) not in ALLOWED
    ]
    assert not found, "spelled outside contracts/ (use contracts.layout / exits / activity_ids):\n" + "\n".join(found)


def test_every_allowed_stray_is_still_there() -> None:
    found = {(f, what) for f, items in stray_scan.scan().items() for _line, what in items}
    assert set(ALLOWED) <= found, f"allowed but gone (drop them from ALLOWED): {sorted(set(ALLOWED) - found)}"


def test_the_scanner_sees_each_kind_of_stray(tmp_path: Path) -> None:
    """The scanner itself can fail: one of each kind of stray in a file is found (and a docstring is not)."""
    src = tmp_path / "m.py"
    src.write_text(
        '"""runs/x/ckpt/LATEST in a docstring is documentation."""\n'
        "import sys\n"
        "EXIT_LOCKED = 75\n"
        "def f(home, rc, aid, s):\n"
        '    a = home / "runs" / "x" / "ckpt" / "LATEST"\n'
        '    b = f"step-{s:06d}"\n'
        '    c = f"train-{s:06d}"\n'
        "    d = rc in (0, 130)\n"
        '    e = aid.startswith("eval-")\n'
        '    g = "runs/x/ckpt/step-000001"\n'
        "    sys.exit(143)\n"
    )
    kinds = {what.split(" ")[0] for _line, what in stray_scan.strays_in(src)}
    assert {"path", "literal", "step", "activity", "exit", "home", "sys.exit(143)"} <= kinds, kinds
    assert all(line > 1 for line, _ in stray_scan.strays_in(src))
    ast.parse(src.read_text())
