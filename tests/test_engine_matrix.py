"""docs/engine-matrix.md (written by tools/engine_matrix.py): its port cells are what the engine ports compute today,
its measured cells are what the evidence run recorded (eval/reports/engine-matrix/results.jsonl), each dated.

Computing the whole matrix (133 model types x 11 methods x every engine, and each type's audit) takes minutes on the
project's 2-core machine, so the suite checks the port cells of a deterministic sample of 5 model types
(`engine_matrix.sample`: evenly spaced in sorted order) and that the page covers every type of the zoo; the full run
is `python tools/engine_matrix.py docs/engine-matrix.md`, outside the suite.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "engine-matrix.md"


def _tool():
    spec = importlib.util.spec_from_file_location("engine_matrix", ROOT / "tools" / "engine_matrix.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


matrix = _tool()


@pytest.fixture(scope="module")
def page():
    return matrix.parse(DOC.read_text(encoding="utf-8"))


def test_the_page_covers_every_rope_model_type_of_the_running_transformers(page):
    """Every type of the zoo is a row of the own-scheme table or of the refused table (a new transformers type fails
    this until the page is regenerated)."""
    own = set(page[matrix.OWN][1])
    refused = set(page[matrix.REFUSED_TABLE][1])
    assert own | refused == set(matrix.zoo_types())
    written = set().union(*(set(table) for title, (_, table) in page.items() if title.startswith("`")))
    assert written.isdisjoint(refused) and written | refused == own | refused


def test_port_cells_of_a_sample_of_model_types_are_what_the_ports_compute_today(page):
    """The sample's cells in every table (own scheme, each method, refused), notes resolved to their text, equal a
    fresh computation through the registered engines (`rope-extend engines`' audit and parity report)."""
    types = matrix.sample(matrix.zoo_types())
    assert len(types) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        computed = matrix.tables(matrix.compute(types), matrix.read_records())
    assert list(computed) == list(page)  # the same tables, in order: the registered methods
    for title, (columns, table) in computed.items():
        shown_columns, shown = page[title]
        assert shown_columns == columns, title  # the registered engines, in order
        for model_type in types:
            assert shown.get(model_type) == table.get(model_type), (title, model_type)
    cells = [cell for _, table in computed.values() for cells in table.values() for cell in cells if len(cell) > 1]
    assert {cell[0] for cell in cells} >= {matrix.IDENTICAL, matrix.UNCHECKED}  # the sample is not all one verdict


def test_measured_cells_are_the_records_with_their_dates(page):
    """Every measured cell on the page comes from a record of the evidence run, shows its verdict and date, and
    every recorded cell is on the page."""
    runs = matrix.measured(matrix.read_records())
    assert runs  # the evidence is committed beside the page
    shown = {}
    for title, (columns, table) in page.items():
        if not title.startswith("`"):
            continue
        for model_type, cells in table.items():
            for engine, cell in zip(columns, cells):
                if len(cell) > 1 and cell[2] is not None:
                    shown[(engine, model_type, title.strip("`"))] = cell[2:]
    assert set(shown) == set(runs)
    for key, (cell, record) in runs.items():
        note = " ".join(cell.note.split()) if cell.note else None
        assert shown[key] == (cell.verdict, note, record["finished"][:10]), key


def test_a_measured_cell_reads_the_engines_numbers():
    """The measured verdict follows the recorded requests: both identical; the long one refused by the engine (its
    words kept); a difference with its numbers; a refused start."""
    ok = {"served": True, "identical": True, "tokens": 32, "max_abs_dlogprob": 1e-6, "mean_abs_dlogprob": 1e-7}
    off = {"served": True, "identical": False, "tokens": 64, "max_abs_dlogprob": 0.91, "mean_abs_dlogprob": 0.17}
    refused = {"served": False, "reason": "vLLM refused the request: This model's maximum context length is 32"}
    start = {"served": False, "reason": "vLLM refused to start: ValueError: Model architectures ['X'] are not supported"}
    assert matrix.run_cell({"short": ok, "long": ok}) == matrix.Cell(matrix.IDENTICAL)
    cell = matrix.run_cell({"short": ok, "long": refused})
    assert cell.verdict == matrix.UP_TO_L and "maximum context length is 32" in cell.note
    cell = matrix.run_cell({"short": off, "long": ok})
    assert cell.verdict == matrix.LONG_ONLY and "max 0.91, mean 0.17 over 64 tokens" in cell.note
    cell = matrix.run_cell({"short": start, "long": start})
    assert cell.verdict == matrix.REFUSED and "are not supported" in cell.note
