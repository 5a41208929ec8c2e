"""Printing lesson text: prose paragraphs wrapped to the console, never inside a formula that fits
on a line, `code` spans in cyan, control characters (a lesson file may hold any) escaped."""

from __future__ import annotations

import re
import textwrap

from rich.console import Console
from rich.text import Text

from stepper.lessons.context import Context
from stepper.lessons.templates import render
from stepper.untrusted import shown
from stepper.views.sinks import WholeLinesOffTerminal, line_width


def say(console: Console, text: str, ctx: Context, style: str | None = None) -> None:
    """Print lesson text: prose paragraphs wrapped to the console, tables and formulas (indented
    lines, or multi-line facts) as they are."""
    for i, paragraph in enumerate(p for p in join_lines(text).split("\n\n") if p.strip()):
        rendered = render(paragraph, ctx)
        if i:
            console.print()
        verbatim = "\n" in rendered or paragraph.startswith(" ")
        console.print(styled(rendered if verbatim else fitted(console, rendered), style), soft_wrap=True)


def fitted(console: Console, text: str) -> str:
    """text wrapped to the console's width (`wrapped`); its lines whole where the console keeps them
    whole (WholeLinesOffTerminal to a pipe or a file)."""
    if isinstance(console, WholeLinesOffTerminal) and line_width(console) is None:
        return text
    return "\n".join(wrapped(shown(text, lines=True), console.width))


def wrapped(text: str, width: int) -> list[str]:
    """Each line of text wrapped at spaces to `width`, never inside a formula that fits on a line
    (relu(q . k) stays whole); a word or formula longer than the line is left whole."""
    out = []
    for line in text.split("\n"):
        glued = list(line)
        for start, end in formula_spans(line):
            if end - start <= width:
                glued[start:end] = ["\0" if c == " " else c for c in glued[start:end]]  # kept: shown() escaped any NUL
        out += [part.replace("\0", " ") for part in textwrap.wrap("".join(glued), width, break_long_words=False,
                                                                   break_on_hyphens=False, expand_tabs=False)] or [""]
    return out


ARITHMETIC = re.compile(r"\(*\d[\d.]*\)*(?: [-+*/=×] \(*\d[\d.]*\)*)+")  # numbers and operators


def formula_spans(text: str) -> list[tuple[int, int]]:
    """[start, end) of each formula in a line: a bracket group attached to the character before it
    (relu(q . k), x[i], f(g(x))), any [...] (a list, a shape), or arithmetic on numbers in brackets
    or with its result ((128 + 64), (128 + 16) * 4 = 576; not a table's "28 * 1" or a "*" marker
    before the next row's numbers). Any other "(" after a space opens prose (a remark in
    parentheses), which may wrap."""
    spans = [match.span() for match in ARITHMETIC.finditer(text) if "(" in match[0] or " = " in match[0]]
    open_at = []
    for i, c in enumerate(text):
        if c in "([":
            open_at.append(i)
        elif c in ")]" and open_at and text[open_at[-1]] + c in ("()", "[]"):
            start = open_at.pop()
            if text[start] == "[" or (start and not text[start - 1].isspace()):
                spans.append((start, i + 1))
    return spans


def join_lines(text: str) -> str:
    """Join the lines of each paragraph so the console can wrap it to its width; paragraphs with
    an indented line (a table, code) keep their lines."""
    paragraphs = re.split(r"\n\s*\n", text.strip("\n"))
    out = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        if any(line.startswith(" ") for line in lines):
            out.append(paragraph)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)


def styled(text: str, style: str | None = None) -> Text:
    """Lesson prose: `code` spans in cyan, the rest as written but for control characters (its lines
    and tabs stay)."""
    out = Text(style=style or "")
    for i, part in enumerate(re.split(r"(`[^`]*`)", shown(text, lines=True))):
        if i % 2:
            out.append(part, style="cyan")
        else:
            out.append(part)
    return out


def indented(console: Console, text: str, style: str | None = None, indent: int = 4) -> None:
    """Print text indented, wrapped at spaces to a terminal's width as `wrapped` wraps (continuation
    lines indented too; to a pipe each line whole), its own line breaks kept."""
    width = line_width(console)
    lines = text.split("\n") if width is None else wrapped(text, max(20, width) - indent)
    console.print(Text("\n".join(" " * indent + line for line in lines), style=style or ""), soft_wrap=True)
