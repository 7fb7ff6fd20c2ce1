"""Text for a terminal: wrapped between words at a width, never inside one, and shell commands that still paste.

The CLI prints through these (`cli.app.say`, `cli.app.say_command`) so that every command's output fits the
terminal (80 columns when output is not a terminal, or $COLUMNS). A word longer than the line (a long path) stays
whole on a line of its own; a shell command is wrapped with ` \\` continuations and its words quoted with shlex, so
the printed lines paste as one command, a path with spaces included.
"""

from __future__ import annotations

import shlex
import textwrap


def wrap(text: str, width: int, indent: str = "", hang: str | None = None) -> list[str]:
    """*text* wrapped between words at *width*: each of its lines starts with *indent*, and the lines it wraps onto
    with *hang* (default: *indent*)."""
    lines: list[str] = []
    for paragraph in str(text).split("\n"):
        lines += textwrap.wrap(paragraph, width=width, initial_indent=indent,
                               subsequent_indent=indent if hang is None else hang, break_long_words=False,
                               break_on_hyphens=False) or [indent.rstrip()]
    return lines


def command_lines(label: str, command: str, width: int, python: bool = False) -> list[str]:
    """*command* after *label*, wrapped at *width*, continuing under the label.

    A shell command breaks between its words (each quoted with shlex; every line but the last ends in ` \\`, so
    the lines paste as one command). Python statements (*command*'s lines) go one per line, a call too long for the
    line broken after its opening parenthesis."""
    hang = " " * len(label)
    if python:
        lines: list[str] = []
        for statement in command.split("\n"):
            head, paren, rest = statement.partition("(")
            if len(hang) + len(statement) > width and paren and rest:
                lines += [head + paren, "    " + rest]
            else:
                lines.append(statement)
        return [(label if i == 0 else hang) + line for i, line in enumerate(lines)]
    words = [shlex.quote(word) for word in shlex.split(command)]
    lines, line = [], label + words[0]
    for word in words[1:]:
        if len(line) + 1 + len(word) + 2 > width:  # room for the " \" that continues the line
            lines.append(line + " \\")
            line = hang + word
        else:
            line += " " + word
    return [*lines, line]


def column_widths(rows: list[tuple[str, ...]], width: int, gap: int = 2) -> list[int]:
    """Widths for a table's columns (*rows*: the header first) that fit *width* with *gap* between columns: each
    column as wide as its longest cell while that fits, then the widest narrowed, never below its longest word
    (so a cell wraps between words, never inside one)."""
    from rich.cells import cell_len

    columns = list(zip(*rows))
    widest = [max(cell_len(cell) for cell in column) for column in columns]
    longest_word = [max(cell_len(word) for cell in column for word in cell.split() or [""]) for column in columns]
    widths = list(widest)
    room = width - gap * (len(widths) - 1)
    while sum(widths) > room:
        slack = [w - m for w, m in zip(widths, longest_word)]
        i = max(range(len(widths)), key=lambda k: (slack[k] > 0, widths[k]))
        if slack[i] <= 0:
            break  # every column is down to its longest word: the table is as narrow as it gets
        widths[i] -= 1
    return widths
