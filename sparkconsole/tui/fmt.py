"""Small text formatters shared by the widgets: absent readings print as an em dash, never as zero."""

from __future__ import annotations

from rich.text import Text

from ..timefmt import DASH as DASH


def num(v: float | None, unit: str = "", digits: int = 0) -> str:
    if v is None:
        return DASH
    return f"{v:.{digits}f}{unit}"


def pct(frac: float | None, digits: int = 0) -> str:
    return DASH if frac is None else f"{frac * 100:.{digits}f}%"


def gib(b: float | None) -> str:
    return DASH if b is None else f"{b / 2**30:.1f} GiB"


def gib_or_mib(b: float | None) -> str:
    """Sizes from KiB to GiB (a KV transfer of a short prompt is a few hundred KiB)."""
    if b is None:
        return DASH
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if b >= scale:
            return f"{b / scale:.1f} {unit}"
    return f"{b / 1024:.0f} KiB"


def ms(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def plural(n: int, word: str, many: str | None = None) -> str:
    """'1 line', '2 lines', '1 past run'."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def clip_words(text: str, room: int) -> str:
    """`text` in `room` cells, cut at a space outside parentheses and marked …: a figure, with its unit in
    parentheses ("(0.1 GiB)"), is shown whole or not at all."""
    if len(text) <= room:
        return text
    if room <= 1:
        return ""
    depth, cut = 0, 0
    for i, ch in enumerate(text[:room - 1]):
        depth += (ch == "(") - (ch == ")")
        if ch == " " and depth <= 0:
            cut = i
    # " …": words left out; an ellipsis against a figure would read as the figure cut short
    return text[:cut].rstrip(" ,:;") + " …" if cut else "…"


def one_line(text: object, room: int | None = None) -> str:
    """`text` (an exception's, a command's output) on one line, its whitespace collapsed; clipped at a word in
    `room` cells (clip_words), never mid-word: a reader takes "runs ou" for a typo, and a command cut mid-way for
    the whole of it."""
    line = " ".join(str(text).split())
    return line if room is None else clip_words(line, room)


def fit(parts: list[tuple[str, str, int]], width: int | None) -> Text:
    """One row of (text, style, priority) parts in `width` cells: the parts of the highest priority number go
    first until the row fits (0: never left out). Neighbouring parts of one priority go together, the last run
    first: a separator, a label and its figure are one thing, never half drawn ("  SM " without its MHz, a " · "
    before nothing). A figure is drawn whole or not at all; only what is left after that is cut, with an
    ellipsis."""
    keep = list(parts)
    if width:
        while sum(len(t) for t, _, _ in keep) > width and any(p for _, _, p in keep):
            worst = max(p for _, _, p in keep)
            end = max(i for i, (_, _, p) in enumerate(keep) if p == worst)
            start = end
            while start > 0 and keep[start - 1][2] == worst:
                start -= 1
            del keep[start:end + 1]
    line = Text(no_wrap=True, overflow="ellipsis")
    for t, style, _ in keep:
        line.append(t, style=style)
    return line
