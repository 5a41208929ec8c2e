"""Printing lesson text: prose paragraphs wrapped to the console, `code` spans in cyan, control
characters (a lesson file may hold any) escaped."""

from __future__ import annotations

import re
import textwrap

from rich.console import Console
from rich.text import Text

from stepper.lessons.context import Context
from stepper.lessons.templates import render
from stepper.untrusted import shown
from stepper.views.sinks import line_width


def say(console: Console, text: str, ctx: Context, style: str | None = None) -> None:
    """Print lesson text: prose paragraphs wrapped to the console, tables and formulas (indented
    lines, or multi-line facts) as they are."""
    for i, paragraph in enumerate(p for p in join_lines(text).split("\n\n") if p.strip()):
        rendered = render(paragraph, ctx)
        if i:
            console.print()
        verbatim = "\n" in rendered or paragraph.startswith(" ")
        console.print(styled(rendered, style), soft_wrap=verbatim)


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
    """Print text indented, wrapped at spaces to a terminal's width (continuation lines indented
    too; to a pipe each line whole), its own line breaks kept."""
    width = line_width(console) or 2**31 - 1
    lines = [textwrap.fill(line, max(20, width), initial_indent=" " * indent, subsequent_indent=" " * indent,
                           break_long_words=False, break_on_hyphens=False)
             for line in text.split("\n")]
    console.print(Text("\n".join(lines), style=style or ""), soft_wrap=True)
