"""The report's plots, read back from the Figures they build: every variant drawn with its own numbers, coinciding
variants told apart and named, every line (reference lines included) in a legend outside the axes, counts at
small n, blank heatmap cells explained.

``tests/data/eval-quick/results.jsonl`` has the shape of ``rope-extend demo``'s quick suite, made of real lines of
``eval/reports``: perplexity at 2k and 16k (``smollm2-paper``: unpatched, linear/YaRN/dynamic-YaRN x2, where
dynamic YaRN equals the unpatched model at 2k and YaRN x2 at 16k), passkey at n = 1 (``smollm2-readme``) and one
needle at 2k (``smollm2-needles-ceiling``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rope_extend import plotstyle
from rope_extend.eval import plots
from rope_extend.eval.runner import compare_records, run_records, write_outputs
from rope_extend.eval.variants import BASELINE

ROOT = Path(__file__).resolve().parent.parent
QUICK = Path(__file__).parent / "data" / "eval-quick" / "results.jsonl"
SMOKE = Path(__file__).parent / "data" / "eval-smoke"  # `rope-extend eval smollm2 --suite smoke --spec
# method=yarn,factor=2` as written (issue 66): every length inside the 8k window, five retrieval tasks
VARIANTS = ["unpatched", "linear-x2", "yarn-x2", "dynamic-yarn-x2"]


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def quick():
    return read(QUICK)


@pytest.fixture(scope="module")
def smoke():
    return run_records(SMOKE)[1]


def legend(fig) -> list[str]:
    """The legend's entries (a long label is wrapped over lines in the figure: read back as one line)."""
    assert len(fig.legends) == 1, "one legend per figure"
    return [" ".join(t.get_text().split()) for t in fig.legends[0].get_texts()]


def drawn(ax, gid):
    lines = [ln for ln in ax.lines if ln.get_gid() == gid]
    assert len(lines) == 1, f"{gid}: {len(lines)} marker lines"
    return lines[0]


def outside(fig, ax) -> bool:
    """The legend's box does not overlap the axes' box (rendered)."""
    fig.canvas.draw()
    return not fig.legends[0].get_window_extent().overlaps(ax.get_window_extent())


def near(x: float, length: int, lengths) -> bool:
    """A point stays within half the gap (in octaves, at most half an octave) to the nearest other length."""
    gap = min([abs(math.log2(other / length)) for other in lengths if other != length] + [1.0])
    return abs(math.log2(x / length)) < gap / 2


def nudge(ax, line) -> list[float]:
    """How far (in points) each of *line*'s markers is drawn from where its data put it on *ax*: its own transform
    (what the renderer draws with) against the axes' data transform, on the same data."""
    import numpy as np

    xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
    pixels = line.get_transform().transform(xy)[:, 0] - ax.transData.transform(xy)[:, 0]
    return list(pixels * 72 / ax.figure.dpi)


def drawn_x(ax, line) -> list[float]:
    """The display x (pixels) of *line*'s markers as drawn."""
    import numpy as np

    xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
    return list(line.get_transform().transform(xy)[:, 0])


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    centre, half = (k + z * z / 2) / (n + z * z), z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    return centre - half, centre + half


def test_loss_vs_position_draws_every_variant_and_names_the_copy(quick):
    fig = plots.loss_vs_position(quick)
    ax, diff_ax = fig.axes  # yarn-x2 and dynamic-yarn-x2 coincide: a difference panel below
    assert legend(fig) == ["unpatched (baseline)", "linear-x2", "yarn-x2",
                           "dynamic-yarn-x2 (= yarn-x2 at every position)", "original window (8k tokens)",
                           plots.BAND_LABEL]
    for v in VARIANTS:
        rec = next(r for r in quick if r["variant"] == v and r["kind"] == "perplexity" and r["length"] == 16384)
        line = drawn(ax, v)
        assert list(line.get_ydata()) == [b["loss"] for b in rec["metrics"]["buckets"]]
        assert list(line.get_xdata()) == [(b["start"] + b["end"]) / 2 for b in rec["metrics"]["buckets"]]
        assert all(abs(dx) <= line.get_markersize() for dx in nudge(ax, line))  # within a marker's size
    xs = [tuple(drawn_x(ax, drawn(ax, v))) for v in VARIANTS]
    assert len(set(xs)) == len(VARIANTS), "no two variants' markers drawn at the same x"
    yarn, dyn = drawn(ax, "yarn-x2"), drawn(ax, "dynamic-yarn-x2")
    assert list(yarn.get_ydata()) == list(dyn.get_ydata())  # the records really coincide ...
    assert yarn.get_marker() != dyn.get_marker() and dyn.get_markerfacecolor() == "none"  # ... and both show
    assert dyn.get_markersize() > yarn.get_markersize() and yarn.get_linestyle() != dyn.get_linestyle()
    assert [ln.get_xdata()[0] for ln in ax.lines if ln.get_gid() == "window"] == [8192]
    assert outside(fig, ax)


def test_loss_vs_position_difference_panel_for_curves_that_coincide():
    """smollm2-paper's ntk-x2, yarn-x2 and dynamic-yarn-x2 lie within a few hundredths of a nat of each other
    over 16k positions (issue 41): the second panel draws them as paired differences from the first, with bands
    from the same blocks; the unpatched model and linear-x2, far away, are named as off its scale."""
    recs = [r for r in run_records(ROOT / "eval/reports/smollm2-paper")[1] if r["kind"] == "perplexity"]
    fig = plots.loss_vs_position(recs)
    ax, diff_ax = fig.axes
    longest = {r["variant"]: r for r in recs if r["metrics"]["text"] == "pydoc_topics" and r["length"] == 16384}
    ref = [b["loss"] for b in longest["ntk-x2"]["metrics"]["buckets"]]
    for v in ("ntk-x2", "yarn-x2", "dynamic-yarn-x2"):
        line = drawn(diff_ax, f"{v}:difference")
        assert list(line.get_ydata()) == pytest.approx(
            [b["loss"] - r for b, r in zip(longest[v]["metrics"]["buckets"], ref)])
    assert not [ln for ln in diff_ax.lines if ln.get_gid() in ("unpatched:difference", "linear-x2:difference")]
    assert "unpatched, linear-x2: off this scale" in diff_ax.get_title()
    # yarn's paired band in the last bucket: the bootstrap of its block differences from ntk there
    yarn, ntk = longest["yarn-x2"]["metrics"], longest["ntk-x2"]["metrics"]
    bs = yarn["block_size"]
    last = [y - n for i, (y, n) in enumerate(zip(yarn["block_losses"], ntk["block_losses"])) if i * bs >= 15360]
    lo, hi = plots.bootstrap_mean_interval(last)
    assert lo < sum(last) / len(last) < hi
    edges = [ln for ln in diff_ax.lines if ln.get_gid() == "band"]
    assert any(math.isclose(ln.get_ydata()[-1], lo) for ln in edges)
    assert any(math.isclose(ln.get_ydata()[-1], hi) for ln in edges)
    assert edges and all(ln.get_alpha() < 1 for ln in edges)


def test_perplexity_vs_length_points_at_measured_lengths_only(quick):
    fig = plots.perplexity_vs_length(quick)
    (ax,) = fig.axes
    assert legend(fig) == ["unpatched (baseline)", "linear-x2", "yarn-x2",
                           "dynamic-yarn-x2 (= unpatched at 2k; = yarn-x2 at 16k)", "original window (8k tokens)"]
    xs = {}
    for v in VARIANTS:
        recs = sorted((r["length"], r["metrics"]) for r in quick if r["variant"] == v and r["kind"] == "perplexity")
        line = drawn(ax, v)
        assert line.get_linestyle() == "None"  # points, not a line
        assert list(line.get_ydata()) == [m["ppl"] for _, m in recs]
        assert list(line.get_xdata()) == [2048, 16384]  # the measured lengths, not beside them
        assert all(abs(dx) <= line.get_markersize() for dx in nudge(ax, line))
        xs[v] = drawn_x(ax, line)
    for i in range(2):  # no two variants drawn at one x: coinciding points stay side by side
        assert len({xs[v][i] for v in VARIANTS}) == len(VARIANTS)
    # 2k and 16k lie on both sides of the 8k window: nothing links them as if measured in between
    assert not [ln for ln in ax.lines if ln.get_gid() == "link"]
    # the records' 95 % intervals are drawn as bars around each point
    unpatched = next(r for r in quick if r["variant"] == "unpatched" and r["length"] == 16384 and r["kind"] == "perplexity")
    lo, hi = unpatched["metrics"]["ppl_ci"]
    spans = [seg[:, 1] for coll in ax.collections for seg in coll.get_segments() if len(seg) == 2]
    assert any(math.isclose(min(s), lo) and math.isclose(max(s), hi) for s in spans)
    assert outside(fig, ax)


def test_perplexity_links_points_inside_the_window():
    recs = [r for r in run_records(ROOT / "eval/reports/smollm2-paper")[1]  # in the run's variant order
            if r["kind"] == "perplexity" and r["metrics"]["text"] == "pydoc_topics"]
    fig = plots.perplexity_vs_length(recs)
    (ax,) = fig.axes
    links = [ln for ln in ax.lines if ln.get_gid() == "link"]
    assert len(links) == 5  # 2k-8k for each variant; 8k-16k crosses the window and is not drawn
    for ln in links:
        assert near(min(ln.get_xdata()), 2048, [2048, 8192, 16384]) and near(max(ln.get_xdata()), 8192, [2048, 8192, 16384])
    assert "dynamic-yarn-x2 (= unpatched at 2k, 8k; = yarn-x2 at 16k)" in legend(fig)


def test_retrieval_accuracy_shows_counts_at_small_n(quick):
    fig = plots.retrieval_accuracy(quick)
    passkey, needle = fig.axes
    assert legend(fig) == ["unpatched (baseline)", "linear-x2 (= unpatched at 16k in passkey/filler, old probe)",
                           "yarn-x2 (= unpatched at 2k in passkey/filler, old probe)",
                           "dynamic-yarn-x2 (= unpatched at 2k in passkey/filler, old probe; = yarn-x2 at 16k in "
                           "passkey/filler, old probe)",
                           "original window (8k tokens)",
                           "ceiling: unpatched at its longest length inside the window"]
    assert "n = 1 prompts per point (counts k/n shown); ceiling 1/1 at 2k" in passkey.get_title()
    labels = {(round(t.xy[0]), t.get_text()) for t in passkey.texts}
    for r in (r for r in quick if r["kind"] == "passkey"):
        line = drawn(passkey, r["variant"])
        i = [round(x / r["length"]) for x in line.get_xdata()].index(1)
        assert line.get_ydata()[i] == r["metrics"]["score"]
        assert (round(line.get_xdata()[i]), f"{r['metrics']['score']:g}/1") in labels
    assert not [c for c in passkey.collections if c.get_gid() != "ceiling"], "no Wilson bars at n = 1"
    ceiling = [c for c in passkey.collections if c.get_gid() == "ceiling"]
    assert len(ceiling) == 1 and ceiling[0].get_segments()[0][0][0] == 8192  # drawn beyond the window
    assert list(drawn(needle, "unpatched").get_ydata()) == [1.0]
    assert [t.get_text() for t in needle.texts] == ["1/1"]
    assert outside(fig, passkey) and outside(fig, needle)


def test_retrieval_accuracy_wilson_bars_from_five_prompts():
    recs = [r for r in run_records(ROOT / "eval/reports/smollm2-paper")[1] if r["kind"] == "passkey"]
    fig = plots.retrieval_accuracy(recs)
    (ax,) = fig.axes
    assert "n = 10 prompts per point (95 % Wilson bars); ceiling 10/10 at 2k" in ax.get_title()
    assert not ax.texts  # no counts: the bars say it
    k = sum(r["metrics"]["score"] for r in recs if r["variant"] == "yarn-x2" and r["length"] == 12288)
    lo, hi = wilson(int(k), 10)
    spans = [seg[:, 1] for coll in ax.collections for seg in coll.get_segments() if len(seg) == 2]
    assert any(math.isclose(min(s), lo, abs_tol=1e-4) and math.isclose(max(s), hi, abs_tol=1e-4) for s in spans)
    assert list(drawn(ax, "yarn-x2").get_ydata()) == [
        sum(r["metrics"]["score"] for r in recs if r["variant"] == "yarn-x2" and r["length"] == L) / 10
        for L in (2048, 12288, 16384)]


def test_heatmap_says_what_a_blank_cell_means(quick):
    recs = read(ROOT / "eval/reports/smollm2-passkey-2x/results.jsonl")
    fig = plots.passkey_heatmap(recs)
    cells = {(r.get("haystack"), r["variant"], r["depth"], r["length"]) for r in recs}
    hays = {c[0] for c in cells}
    full = {(h, v, d, L) for h in hays for v in {c[1] for c in cells} for d in {c[2] for c in cells}
            for L in {c[3] for c in cells}}
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert texts.count("not run") == len(full - cells) > 0
    assert len(texts) == len(full)
    assert '"not run": no prompt at that depth and length' in fig._suptitle.get_text()
    quick_fig = plots.passkey_heatmap(quick)  # every cell run: no "not run", no caption for it
    assert "not run" not in [t.get_text() for ax in quick_fig.axes for t in ax.texts]
    assert "not run" not in quick_fig._suptitle.get_text()


def test_coincidences_are_found_from_the_numbers():
    series = {"a": {1: 1.0, 2: 2.0, 3: 3.0}, "b": {1: 1.5, 2: 2.0, 3: 3.5}, "c": {1: 1.0, 2: 2.0, 3: 3.5},
              "d": {1: 1.0 + 1e-4, 2: 2.1, 3: 3.1}}
    notes = plots.coincidences(series, lambda xs, all_xs: "at " + ",".join(map(str, xs)))
    assert notes == {"b": "= a at 2", "c": "= a at 1,2; = b at 3"}  # d differs everywhere (1e-4 is a difference)
    centres = [512 + 1024 * i for i in range(16)]  # 1k buckets of a 16k sequence, window 8k
    words = plots._describe_positions(8192)
    assert words(centres[8:], centres) == "beyond 8k" and words(centres[:8], centres) == "inside 8k"
    assert words(centres, centres) == "at every position"
    assert words(centres[:2] + centres[5:6], centres) == "over 0–2k, 5k–6k"
    assert words(centres[::2], centres) == "at 8 of 16 positions"


def test_entropy_plot():
    ent = [{"variant": v, "kind": "entropy", "length": L, "original_length": 8192,
            "metrics": {"mean_entropy": e}}
           for v, pts in {"unpatched": [(4096, 3.1), (16384, 4.0)], "yarn-x2": [(4096, 3.1), (16384, 3.6)]}.items()
           for L, e in pts]
    fig = plots.attention_entropy(ent)
    (ax,) = fig.axes
    assert legend(fig) == ["unpatched (baseline)", "yarn-x2 (= unpatched at 4k)", "original window (8k tokens)"]
    assert list(drawn(ax, "yarn-x2").get_ydata()) == [3.1, 3.6]
    assert list(drawn(ax, "yarn-x2").get_xdata()) == list(drawn(ax, "unpatched").get_xdata()) == [4096, 16384]
    assert drawn_x(ax, drawn(ax, "yarn-x2"))[0] != drawn_x(ax, drawn(ax, "unpatched"))[0]  # side by side
    assert not [ln for ln in ax.lines if ln.get_gid() == "link"]  # 4k and 16k: across the window


def test_report_links_the_plots(quick, tmp_path):
    report = write_outputs(quick, tmp_path).read_text()
    for name in ("loss_vs_position.png", "perplexity_vs_length.png", "passkey_heatmap.png", "retrieval_accuracy.png"):
        assert f"]({name})" in report
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "attention_entropy.png").exists()  # no entropy records, no plot


# ---------------------------------------------------------------- issue 41: every method told apart


def test_every_variant_has_its_own_colour_marker_and_line_style():
    """The Okabe-Ito palette, black for the baseline; no two series share a colour, a marker or a line style
    (up to the palette's 7 series after the baseline), and no two of many share all three."""
    names = [BASELINE, *(f"v{i}" for i in range(7))]
    styles = plots.variant_styles([{"variant": v} for v in names])
    for key in ("color", "marker", "ls"):
        assert len({repr(st[key]) for st in styles.values()}) == len(names), key
    assert styles[BASELINE]["color"] == "black"
    assert {st["color"] for v, st in styles.items() if v != BASELINE} <= set(plotstyle.PALETTE)
    many = [plotstyle.series_style(i) for i in range(70)]
    assert len({(s["color"], s["marker"], repr(s["ls"])) for s in many}) == 70


def test_drawn_series_keep_distinct_styles(quick):
    """Read back from the figures: each variant's markers differ from every other's in colour and marker."""
    for build in (plots.perplexity_vs_length, plots.retrieval_accuracy, plots.loss_vs_position):
        ax = build(quick).axes[0]
        looks = {v: (drawn(ax, v).get_color(), drawn(ax, v).get_marker()) for v in VARIANTS}
        assert len({c for c, _ in looks.values()}) == len({m for _, m in looks.values()}) == len(VARIANTS)


def test_heatmap_colormap_is_colour_blind_safe(quick):
    fig = plots.passkey_heatmap(quick)
    cmaps = {im.get_cmap().name for ax in fig.axes for im in ax.images}
    assert cmaps and cmaps <= plotstyle.COLORBLIND_SAFE_CMAPS
    assert "RdYlGn" not in cmaps


def ticks(ax, axis="x") -> list[str]:
    """The labelled major ticks inside the axis' limits (rendered)."""
    ax.figure.canvas.draw()
    which = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    return [t.get_text() for t in which.get_majorticklabels() if t.get_text() and lo <= t.get_position()[
        0 if axis == "x" else 1] <= hi]


def test_log_length_axes_carry_four_plain_labelled_ticks(quick):
    """2k and 16k were measured; the axis reads 2k, 4k, 8k, 16k (plain, never 2^11 or 10^4)."""
    ax = plots.perplexity_vs_length(quick).axes[0]
    assert ax.get_xscale() == "log"
    assert ticks(ax) == ["2k", "4k", "8k", "16k"]
    labels = ticks(plots.retrieval_accuracy(quick).axes[0])
    assert len(labels) >= 4 and all(t.endswith("k") and t[:-1].replace(".", "").isdigit() for t in labels)
    assert plotstyle.length_ticks(10240, 25600, [16384]) == [10240, 12288, 14336, 16384, 20480, 24576]
    assert plotstyle.value_ticks(1.0, 2.0) == [1, 1.25, 1.5, 1.75, 2]
    assert plotstyle.value_ticks(9, 40) == [10, 15, 20, 30]


def test_overlapping_markers_stand_side_by_side_at_the_measured_length(quick):
    """Three of the four variants retrieve the passkey at 2k (the issue's markers on one spot): four drawn x
    positions, ordered as the legend, each at most a marker's size from 2k, whose data stay 2048; the later
    variants that equal an earlier one are hollow and larger, so the one below shows through."""
    ax = plots.retrieval_accuracy(quick).axes[0]
    lines = [drawn(ax, v) for v in VARIANTS]
    assert [line.get_xdata()[0] for line in lines] == [2048] * 4
    assert [line.get_ydata()[0] for line in lines] == [1.0, 0.0, 1.0, 1.0]
    at_2k = [drawn_x(ax, line)[0] for line in lines]
    assert at_2k == sorted(at_2k) and len(set(at_2k)) == 4
    assert all(abs(nudge(ax, line)[0]) <= line.get_markersize() for line in lines)
    assert [line.get_markerfacecolor() == "none" for line in lines] == [False, True, True, True]
    assert plots.nudge_points(0, 1) == 0 and plots.nudge_points(0, 2) == -plots.nudge_points(1, 2)
    assert all(abs(plots.nudge_points(i, 9)) <= plots.MARKER_SIZE for i in range(9))


def test_trained_perplexity_before_after_from_the_base_models_records():
    """smollm2-trained-16k holds the trained model alone; smollm2-paper has the unpatched model and training-free
    yarn-x2 on the same cases: pooled, the plot shows all three and says where the 'before' came from. Without
    them, the title says there is no before."""
    folder = ROOT / "eval/reports/smollm2-trained-16k"
    records = run_records(folder)[1]
    alone = plots.perplexity_vs_length(records)
    assert "no unpatched (before) numbers in these records" in alone._suptitle.get_text()
    before = compare_records(records, [ROOT / "eval/reports/smollm2-paper"], ["unpatched", "yarn-x2"])
    assert {r["variant"] for r in before} == {"unpatched", "yarn-x2"}
    assert {r["case_id"] for r in before} == {r["case_id"] for r in records if r["kind"] == "perplexity"}
    fig = plots.perplexity_vs_length(before + records)
    assert legend(fig)[:3] == ["unpatched (baseline)", "yarn-x2", "trained yarn-x2"]
    title = fig._suptitle.get_text()
    assert "unpatched, yarn-x2: records of" in title and "smollm2-paper" in title
    paper = {(r["variant"], r["case_id"]): r["metrics"].get("ppl")
             for r in read(ROOT / "eval/reports/smollm2-paper/results.jsonl")}
    ax = fig.axes[0]  # pydoc_topics
    assert list(drawn(ax, "unpatched").get_ydata()) == [paper[("unpatched", f"perplexity/pydoc_topics/L{L}")]
                                                        for L in (2048, 8192, 16384)]


def test_eval_report_compare_redraws_the_plots_only(tmp_path):
    """`rope-extend eval-report OUT --compare DIR`: the plots gain DIR's variants; report.md stays OUT's own."""
    import shutil

    from rope_extend.cli import main

    out = tmp_path / "trained"
    shutil.copytree(ROOT / "eval/reports/smollm2-trained-16k", out, ignore=shutil.ignore_patterns("training", "*.png"))
    assert main(["eval-report", str(out), "--compare", str(ROOT / "eval/reports/smollm2-paper"),
                 "--compare-variant", "unpatched", "--compare-variant", "yarn-x2"]) == 0
    report = (out / "report.md").read_text()
    assert "| trained yarn-x2 |" in report and "| unpatched |" not in report
    assert (out / "perplexity_vs_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["eval-report", str(out), "--compare", str(tmp_path / "nowhere")]) == 2


def test_training_loss_has_a_smoothed_line():
    """The committed 50-step run: each step's loss as logged, and beside it the trailing mean of 5 steps (a tenth
    of the run), checked against numpy's convolution of the logged losses."""
    import numpy as np

    from rope_extend.train import training_card as card

    folder = ROOT / "eval/reports/smollm2-trained-16k/training"
    rows = [r for r in read(folder / "training_log.jsonl") if "loss" in r]
    fig = card.loss_figure([(r["step"], r["loss"]) for r in rows], "t")
    (ax,) = fig.axes
    assert list(drawn(ax, "step").get_ydata()) == [r["loss"] for r in rows]
    smoothed = drawn(ax, "smoothed")
    expected = np.convolve([r["loss"] for r in rows], np.ones(5) / 5, mode="valid")
    assert list(smoothed.get_xdata()) == [r["step"] for r in rows][4:]
    assert np.allclose(smoothed.get_ydata(), expected)
    assert smoothed.get_linewidth() > drawn(ax, "step").get_linewidth()
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["each step (one batch)", "mean of the last 5 steps"]
    assert card.smoothing_window(3) == 3 and card.smoothing_window(400) == 40


def tune_result():
    """smollm2-tune-16k's search as `tune` returns it, from its committed log and best-*.yaml (no model run)."""
    import yaml
    from transformers import LlamaConfig

    from rope_extend.tune.search import Scored, TuneResult
    from rope_extend.tune.space import Candidate, Geometry

    folder = ROOT / "eval/reports/smollm2-tune-16k"
    head, *evals = read(folder / "search.jsonl")
    geom = Geometry(head["rotary_dim"], head["base"], head["original_length"], head["target_length"])

    def best(name, family):
        spec = {k: v for k, v in yaml.safe_load((folder / name).read_text()).items()
                if k != "original_max_position_embeddings"}
        rec = min((r for r in evals if r["family"] == family and r["rung"] == 1), key=lambda r: r["loss"])
        return Scored(Candidate(rec["name"], spec, family), rec["loss"], rec["length"])

    closed, per_dim = best("best-closed.yaml", "closed"), best("best-per-dim.yaml", "per-dim")
    result = TuneResult(geom, head["rungs"], head["schedule"], head["budget"], evals, per_dim, closed, per_dim, 5.9, 0)
    config = LlamaConfig(hidden_size=576, num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         num_hidden_layers=2, max_position_embeddings=8192, rope_theta=100000.0)
    return result, config


def test_tune_curve_tells_coinciding_curves_apart():
    """YaRN x2, NTK-by-parts x2, the tuned closed form (YaRN x2 again) and the tuned per-dim curve have the same
    factors at every disk (issue 41: three of them were hidden): each is named as equal to YaRN in the legend,
    drawn hollow with its markers on disks no other curve marks; the attention panel tells them apart; the factor
    axis carries at least four plain ticks."""
    from rope_extend.tune.report import curve_figure

    result, config = tune_result()
    fig = curve_figure(result, config)
    ax_inv, ax_f, ax_a = fig.axes
    labels = legend(fig)
    for name in ("ntk-by-parts", "tuned closed: yarn x2", "tuned per-dim (long factors)"):
        assert f"{name} (= yarn at every disk)" in labels
        assert drawn(ax_f, name).get_markerfacecolor() == "none"
    assert list(drawn(ax_f, "yarn").get_ydata()) == pytest.approx(list(drawn(ax_f, "ntk-by-parts").get_ydata()))
    marked = [tuple(drawn(ax_f, name).get_markevery()) for name in
              ("original", "linear", "ntk", "yarn", "ntk-by-parts", "llama3", "tuned closed: yarn x2",
               "tuned per-dim (long factors)")]
    assert len({m[0] for m in marked}) == len(marked)  # every curve marks its own disks
    looks = {(ln.get_color(), ln.get_marker(), str(ln.get_linestyle())) for ln in ax_f.lines}
    assert len(looks) == len(ax_f.lines)
    assert ticks(ax_f, "y") == ["1", "1.25", "1.5", "1.75", "2"]
    widths = {p.get_gid(): p.get_width() for p in ax_a.patches}
    assert widths["yarn"] == pytest.approx(1 + 0.1 * math.log(2))  # YaRN's 0.1 ln(s) + 1
    assert widths["ntk-by-parts"] == 1.0 and widths["tuned per-dim (long factors)"] == pytest.approx(1.04931)


def test_perplexity_spanning_a_factor_of_30_is_on_a_log_axis():
    """smollm2-ppl-4x: the unpatched model reaches ~300 at 32k while the methods stay near 10-15; a linear axis
    (what a margin below 0 used to force) flattens every method onto one line."""
    recs = run_records(ROOT / "eval/reports/smollm2-ppl-4x")[1]
    ax = plots.perplexity_vs_length(recs).axes[0]
    assert ax.get_yscale() == "log"
    labels = ticks(ax, "y")
    assert len(labels) >= 4 and all(t.replace(".", "").isdigit() for t in labels)


# ---------------------------------------------------------------- issue 66: plots a reader can trust


def test_markers_sit_at_the_measured_lengths_on_a_log_axis(smoke):
    """The smoke run measured perplexity at 256 and 512 tokens and entropy at 128 and 256: the markers' data are those
    lengths (the sideways dodge put them at 224/448 and 112/224 on an axis labelled "markers at the measured
    lengths"); both variants still stand side by side, each within its marker's size of the length."""
    for build, kind, lengths in ((plots.perplexity_vs_length, "perplexity", [256, 512]),
                                 (plots.attention_entropy, "entropy", [128, 256])):
        ax = build(smoke).axes[0]
        drawn_at = []
        for v in ("unpatched", "yarn-x2"):
            line = drawn(ax, v)
            assert list(line.get_xdata()) == lengths, (kind, v)
            assert sorted({r["length"] for r in smoke if r["kind"] == kind and r["variant"] == v}) == lengths
            assert all(0 < abs(dx) <= line.get_markersize() for dx in nudge(ax, line))
            drawn_at.append(drawn_x(ax, line))
        assert all(a < b for a, b in zip(*drawn_at))  # unpatched left of yarn-x2 at each length, as in the legend
        assert ax.xaxis.get_label().get_text() == plots.LENGTH_LABEL


def test_the_legend_lists_only_what_is_drawn(smoke, quick):
    """Every smoke length lies inside the 8k window: no window line is drawn, so no legend lists one (its title says
    the window is off the axis); where the window is on the axis (the quick run's 16k), it is drawn and listed."""
    builders = (plots.perplexity_vs_length, plots.attention_entropy, plots.retrieval_accuracy, plots.loss_vs_position)
    for build in builders:
        fig = build(smoke)
        assert not any("original window" in label for label in legend(fig)), build.__name__
        assert not [ln for ax in fig.axes for ln in ax.lines if ln.get_gid() == "window"], build.__name__
        assert not [c for ax in fig.axes for c in ax.collections if c.get_gid() == "ceiling"], build.__name__
        assert "inside the original 8k-token window" in " ".join(fig.legends[0].get_title().get_text().split())
        handles = fig.legends[0].legend_handles
        assert len(handles) == len(legend(fig))
    for build in builders[:1] + builders[2:]:
        fig = build(quick)
        assert "original window (8k tokens)" in legend(fig)
        assert [ln.get_xdata()[0] for ln in fig.axes[0].lines if ln.get_gid() == "window"] == [8192]


def test_every_line_of_the_loss_plot_is_explained(smoke, quick):
    """The quick run's bands (eight 128-token blocks per 1k bucket) are drawn as a light fill between thin lines in
    the series' style: the legend says so. The smoke run's buckets hold one block each: no band (no interval from one
    block), no thin lines, no legend entry for them."""
    fig = plots.loss_vs_position(quick)
    gids = {ln.get_gid() for ax in fig.axes for ln in ax.lines}
    assert gids == {*VARIANTS, "band", "window", *(f"{v}:difference" for v in ("yarn-x2", "dynamic-yarn-x2"))}
    assert plots.BAND_LABEL in legend(fig)
    fig = plots.loss_vs_position(smoke)
    (ax,) = fig.axes
    assert {ln.get_gid() for ln in ax.lines} == {"unpatched", "yarn-x2"}
    assert legend(fig) == ["unpatched (baseline)", "yarn-x2"] and not ax.collections
    assert ax.get_ylabel() == "mean next-token loss"


def test_retrieval_panels_stand_in_a_grid(smoke):
    """The smoke run has five retrieval tasks: a grid of two columns and three rows (not a 3443x452 strip), one
    panel each, the accuracy label on the left column only."""
    fig = plots.retrieval_accuracy(smoke)
    assert len(fig.axes) == 5
    fig.canvas.draw()
    boxes = [ax.get_position() for ax in fig.axes]
    assert len({round(b.x0, 3) for b in boxes}) == plots.GRID_COLUMNS == 2
    assert len({round(b.y0, 3) for b in boxes}) == 3
    width, height = fig.get_size_inches()
    assert width / height < 2
    assert [bool(ax.get_ylabel()) for ax in fig.axes] == [True, False, True, False, True]
    assert [ax.get_title().split("\n")[0] for ax in fig.axes] == [
        "passkey/filler", "niah_single/filler", "niah_multikey/filler", "niah_multivalue/filler", "vt/filler"]
