"""What is wrong with a scenario: each problem located as precisely as its input allows.

Every reader of user input (the YAML loader, the trace and CSV readers, the workload generator)
reports with these, so the command line prints one form: ``file:line:col: dotted.path: message``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario, located as precisely as the input allows."""

    source: str
    path: str
    message: str
    line: int | None = None
    col: int | None = None

    def __str__(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}" if self.col is None else f":{self.line}:{self.col}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ScenarioError(ValueError):
    """A scenario that cannot be used; ``problems`` says every reason."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))
