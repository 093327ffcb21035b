"""One error type for everything an operator can get wrong, printed as a single line.

Every user-facing failure (bad cluster file, bad recipe, refused launch, unreachable node) is raised
as `UserError`; the CLI prints `str(err)` and exits 2 — never a traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A mistake the operator can fix: names the file, the line, the field and the fix."""

    def __init__(self, problem: str, *, file: str | None = None, line: int | None = None,
                 field: str | None = None, fix: str | None = None) -> None:
        self.problem = problem
        self.file = file
        self.line = line
        self.field = field
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.file:
            where = self.file + (f":{self.line}" if self.line else "")
        parts = [p for p in (where, self.field) if p]
        head = ": ".join(parts)
        text = f"{head}: {self.problem}" if head else self.problem
        if self.fix:
            text += f" — fix: {self.fix}"
        # One line, always: a value with a newline in it must not break the format.
        return " ".join(text.split())
