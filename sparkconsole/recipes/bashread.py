"""A recipe's command template read as bash reads the runner's launch script.

spark-vllm-docker's runner (run-recipe.py) fills the template, writes it into a bash script and runs that:
so a `#` that starts a word is a comment, backslash-newline joins lines, and a line that does not continue
ends the command. The plan reads the same way (launch/argv.py command_argv), and the recipe reader warns
where bash would see more than one command (recipes/v1.py).
"""

from __future__ import annotations

import re

# A backslash before the end of a line continues it; one before the end of the text (a recipe file whose last
# line ends in a backslash, with no newline after it) ends the script there, and bash drops it.
_CONTINUATION = re.compile(r"\\[ \t]*(?:\r?\n|\Z)")


def bash_command_lines(text: str) -> list[tuple[int, str]]:
    """The command template's non-empty logical lines as bash reads a script: backslash-newline joins lines
    (outside single quotes), a `#` that starts a word comments out the rest of its line (a trailing
    `\\` included, so a commented-out flag ends the command there), quotes are kept for shlex. The lines
    come back with their comments removed (so extra arguments appended to the last one are never commented
    out), each with the 1-based line of the text it starts on."""
    lines: list[tuple[int, str]] = []
    cur: list[str] = []
    line, start = 1, 1
    quote: str | None = None
    word_start = True
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote is not None and c == "\n":  # a newline inside quotes is part of the word
            line += 1
        if quote == "'":                    # single quotes: everything literal up to the closing quote
            cur.append(c)
            quote = None if c == "'" else quote
            i += 1
            continue
        if c == "\\":
            # A line continuation, in or out of double quotes. Blanks after the backslash are forgiven (bash
            # would end the command there, an invisible mistake): the one place we read more than bash.
            m = _CONTINUATION.match(text, i)
            if m:
                i = m.end()
                line += 1
                continue
            cur.append(text[i:i + 2])
            word_start = False if quote is None else word_start
            i += 2
            continue
        if quote == '"':
            cur.append(c)
            quote = None if c == '"' else quote
            i += 1
            continue
        if c == "#" and word_start:         # a comment: up to (not including) the end of the line
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "\n":
            lines.append((start, "".join(cur).strip()))
            cur, word_start = [], True
            line += 1
            start = line
            i += 1
            continue
        cur.append(c)
        if c in "'\"":
            quote, word_start = c, False
        else:
            word_start = c in " \t\r;&|()<>"
        i += 1
    lines.append((start, "".join(cur).strip()))
    return [(no, ln) for no, ln in lines if ln]


def command_warnings(command: str, file: str, line: int | None) -> list[str]:
    """Where bash (the runner's reader) sees more than one command: each extra line runs only after vLLM
    exits, so its flags never reach vLLM. Typically a commented-out flag in the middle of a continued command,
    whose comment swallows the trailing backslash. Planned as the runner runs it (under bash), and said."""
    commands = bash_command_lines(command)
    return [f"{file}:{line}: command: line {no} of the command ({text[:40]!r}) is a command of its own as bash "
            "reads it (the line before it does not continue; a comment swallows its trailing backslash) — "
            "fix: join it to the vllm command or delete it" for no, text in commands[1:]]
