"""What a sweep reports: each run that mismatched (``Mismatch``: the positions, the lines, the command
that reproduces it) and the counts of a sweep (``Report``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .scenario import Scenario


@dataclass
class Mismatch:
    what: str  # "kill", "kills", "cancel", "reference", "oom", "failed-suite"
    kills: list[int]
    lines: list[str]
    command: str
    cancel_at: int | None = None
    seed: int | None = None
    home: str | None = None

    def __str__(self) -> str:
        where = f"kills at {self.kills}" if self.kills else "no kill"
        if self.cancel_at is not None:
            where += f", cancel at {self.cancel_at}"
        if self.seed is not None:
            where += f", seed {self.seed}"
        head = f"MISMATCH ({self.what}; {where}):"
        body = "\n".join(f"  - {line}" for line in self.lines[:8])
        more = f"\n  ... {len(self.lines) - 8} more" if len(self.lines) > 8 else ""
        home = f"\n  files kept in {self.home}" if self.home else ""
        return f"{head}\n{body}{more}{home}\n  rerun: {self.command}"


@dataclass
class Report:
    name: str
    tried: int = 0
    matched: int = 0
    positions: int = 0
    elapsed_s: float = 0.0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches and self.tried == self.matched

    def record(self, mismatch: Mismatch | None) -> bool:
        """Count one run; True when it mismatched."""
        self.tried += 1
        if mismatch is None:
            self.matched += 1
            return False
        self.mismatches.append(mismatch)
        return True

    def summary(self) -> str:
        rate = self.tried / self.elapsed_s if self.elapsed_s > 0 else 0.0
        return (
            f"{self.name}: {self.tried} tried, {self.matched} matched, {len(self.mismatches)} mismatched "
            f"({self.positions} positions in the uninterrupted run; {self.elapsed_s:.1f}s, {rate:.0f}/s)"
        )


def rerun_command(
    scn: Scenario, kills: Iterable[int], *, cancel_at: int | None = None, mutant: str | None = None
) -> str:
    cmd = f"python -m simulator kill-at {scn.flags()} --kills {','.join(map(str, kills)) or 'none'}"
    if cancel_at is not None:
        cmd += f" --cancel-at {cancel_at}"
    if mutant:
        cmd += f" --mutant {mutant}"
    return cmd
