"""Text for a terminal: wrapped between words at a width, never inside one, and shell commands that still paste.

The CLI prints through these (`cli.app.say`, `cli.app.say_command`) so that every command's output fits the
terminal (80 columns when output is not a terminal, or $COLUMNS). A word longer than the line (a long path) stays
whole on a line of its own; a shell command is wrapped with ` \\` continuations and its words quoted with shlex, so
the printed lines paste as one command, a path with spaces included.
"""

from __future__ import annotations

import shlex
import textwrap

KEEP = "\u00a0"  # joins the words of a quoted path (`shell_path`) so that `wrap` never breaks it; printed as a space


def shell_path(path) -> str:
    """*path* as a shell reads it (quoted by shlex where it needs to be: `'my out'`), one word for `wrap`, so that a
    printed path pastes into a shell whole."""
    return shlex.quote(str(path)).replace(" ", KEEP)


def shown_name(name: str) -> str:
    """A file name as printed: control characters, escape sequences, newlines and undecodable bytes escaped the way
    Python writes them (`\\x1b`, `\\n`, `\\udcff`), so a name cannot move the cursor, recolour the terminal or
    fake a line of output."""
    if name.isprintable():
        return name
    return "".join(c if c.isprintable() else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if ord(c) < 0xD800 or ord(c) > 0xDFFF else f"\\u{ord(c):04x}" for c in name)


def wrap(text: str, width: int, indent: str = "", hang: str | None = None) -> list[str]:
    """*text* wrapped between words at *width*: each of its lines starts with *indent*, and the lines it wraps onto
    with *hang* (default: *indent*); a `shell_path` stays whole."""
    lines: list[str] = []
    for paragraph in str(text).split("\n"):
        lines += textwrap.wrap(paragraph, width=width, initial_indent=indent,
                               subsequent_indent=indent if hang is None else hang, break_long_words=False,
                               break_on_hyphens=False) or [indent.rstrip()]
    return [line.replace(KEEP, " ") for line in lines]


def command_lines(label: str, command: str, width: int, python: bool = False, hang: str | None = None) -> list[str]:
    """*command* after *label*, wrapped at *width*, continuing under the label (or after *hang*).

    A shell command breaks between its words (each quoted with shlex; every line but the last ends in ` \\`, so
    the lines paste as one command). Python statements (*command*'s lines) go one per line, a call too long for the
    line broken after its opening parenthesis."""
    hang = " " * len(label) if hang is None else hang
    if python:
        lines: list[str] = []
        for statement in command.split("\n"):
            head, paren, rest = statement.partition("(")
            if len(hang) + len(statement) > width and paren and rest:
                lines += [head + paren, *_python_literal_lines(rest, width - len(hang) - 4)]
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


def _python_literal_lines(argument: str, width: int) -> list[str]:
    """A call's `'string')` argument on lines of *width* (indented by 4): a string too long is split after a `/`
    into adjacent literals, which Python joins (`'/a/b/' 'c')`)."""
    import ast

    quoted, close = argument[:-1], argument[-1:]
    try:
        value = ast.literal_eval(quoted) if close == ")" else None
    except (ValueError, SyntaxError):
        value = None
    if not isinstance(value, str) or len(argument) <= width:
        return ["    " + argument]
    parts = value.split("/")
    pieces, piece = [], ""
    for part in [part + "/" for part in parts[:-1]] + parts[-1:]:  # every "/" kept, ending its piece
        if piece and len(repr(piece + part)) > width - 1:
            pieces.append(piece)
            piece = ""
        piece += part
    pieces.append(piece)
    return ["    " + repr(p) + (close if i == len(pieces) - 1 else "") for i, p in enumerate(pieces)]


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


def fits(widths: list[int], width: int, gap: int = 2) -> bool:
    """Whether columns of *widths* (`column_widths`) fit *width*: false when even each column's longest word does
    not."""
    return sum(widths) + gap * (len(widths) - 1) <= width


def row_lines(header: list[str], rows: list[list[str]], width: int) -> list[str]:
    """A table too wide for *width* as one wrapped line per row: "first cell: header value; header value..."."""
    lines = []
    for row in rows:
        cells = "; ".join(f"{name} {cell}" for name, cell in zip(header[1:], row[1:]))
        lines += wrap(f"{row[0]}: {cells}", width, hang="    ")
    return lines


def table_lines(header: list[str], rows: list[list[str]], width: int) -> list[str]:
    """A table at *width*: columns (`column_widths`) whose cells wrap between words; when even each column's
    longest word does not fit, one wrapped line per row instead ("first cell: header value; ...")."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    widths = column_widths([tuple(header), *map(tuple, rows)], width)
    if not fits(widths, width):
        return row_lines(header, rows, width)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for name, column_width in zip(header, widths):
        table.add_column(Text(name), width=column_width)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None, force_terminal=False, legacy_windows=False).print(table)
    return [line.rstrip() for line in buffer.getvalue().splitlines()]


def help_lines(command, ctx, width: int) -> list[str]:
    """A click/typer command's `--help` at *width*, for terminals too narrow for typer's rich tables: the usage, the
    description, each argument, option and subcommand on its own line with its help wrapped between words below it,
    and the epilog's indented lines (the examples) as shell commands that paste (`command_lines`)."""
    import inspect

    params = command.get_params(ctx)
    arguments = [p for p in params if p.param_type_name == "argument"]
    usage = [ctx.command_path, "[OPTIONS]", *(p.name.upper() for p in arguments)]
    if hasattr(command, "list_commands"):
        usage += ["COMMAND", "[ARGS]..."]
    lines = wrap("Usage: " + " ".join(usage), width, hang="  ")
    if command.help:
        lines += ["", *wrap(inspect.cleandoc(command.help), width, indent="  ")]

    def entries(title: str, records: list[tuple[str, str]]) -> None:
        if records:
            lines.extend(["", f"{title}:"])
        for name, text in records:
            lines.extend(wrap(name, width, indent="  ", hang="    "))
            if text:
                lines.extend(wrap(text, width, indent="      "))

    entries("Arguments", [(p.name.upper(), (p.get_help_record(ctx) or ("", ""))[1]) for p in arguments])
    entries("Options", [r for p in params if p not in arguments and (r := p.get_help_record(ctx))])
    if hasattr(command, "list_commands"):
        subcommands = [command.get_command(ctx, name) for name in command.list_commands(ctx)]
        entries("Commands", [(sub.name, sub.short_help or " ".join(inspect.cleandoc(sub.help or "").split("\n\n")[0]
                                                                     .split())) for sub in subcommands if not sub.hidden])
    for paragraph in (command.epilog or "").strip("\n").split("\n\n") if command.epilog else []:
        lines.append("")
        for line in paragraph.splitlines():
            if line.startswith("  "):
                try:
                    lines.extend(command_lines("  ", line.strip(), width, hang="      "))
                    continue
                except ValueError:  # not a shell command after all
                    pass
            lines.extend(wrap(line, width))
    return lines


def markdown_lines(text: str, width: int) -> list[str]:
    """Markdown (a report's summary) for a terminal of *width*: paragraphs, list items and quotes wrapped between
    words, tables as `table_lines`."""
    lines, out, i = str(text).splitlines(), [], 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            block = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                block.append([cell.strip() for cell in lines[i].strip().strip("|").split("|")])
                i += 1
            rows = [row for row in block[1:] if not all(set(cell) <= set("-: ") for cell in row)]
            out += table_lines(block[0], rows, width)
            continue
        line = lines[i]
        hang = "> " if line.startswith(">") else ("  " if line.lstrip().startswith(("- ", "* ")) else "")
        out += wrap(line, width, hang=hang)
        i += 1
    return out
