"""What a table says about itself: cells whose selection chose step 0 or broke an all-way tie are
marked, with a footnote, in every format; ± is defined once with the trial count in every format;
LaTeX typesets a leading minus as a minus."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from domaingen.tables.collect import Collection
from domaingen.tables.reporting import (ERROR_TITLES, MARKS, STEP0, TIED, build_tables, latex_escape, latex_table,
                                        to_csv, to_latex, to_markdown, trial_counts)
from domaingen.tables.selection import select
from test_selection import rec

OUTS_AT = {  # (test_env, trial, step) -> the two training environments' out accuracy (validation)
    # env 0: trial 0 validates best at step 0, trial 1 at step 10
    (0, 0, 0): .8, (0, 0, 10): .6, (0, 1, 0): .5, (0, 1, 10): .7,
    # env 1: trial 0's two checkpoints tie (steps 10 and 20: the earlier wins, no step 0); trial 1 does not
    (1, 0, 10): .6, (1, 0, 20): .6, (1, 1, 10): .5, (1, 1, 20): .7,
    # env 2: trained checkpoints win in both trials
    (2, 0, 0): .5, (2, 0, 10): .7, (2, 1, 0): .5, (2, 1, 10): .8,
}


def marked_collection() -> Collection:
    rows = []
    for (env, trial, step), val in OUTS_AT.items():
        ins = [.9, .9, .9]
        ins[env] = .40 + step / 100 + trial / 10  # the test accuracy: distinct per checkpoint
        rows.append(rec("ERM", [env], 0, trial, step, ins, [val] * 3, dataset="ColoredMNIST"))
    return Collection(pd.DataFrame(rows))


def test_select_reports_step_and_ties_per_trial():
    chosen = select(marked_collection().records, "training")
    by = {(r.test_env, r.trial_seed): (r.step, r.tied) for r in chosen.itertuples()}
    assert by == {(0, 0): (0, False), (0, 1): (10, False), (1, 0): (10, True), (1, 1): (20, False),
                  (2, 0): (10, False), (2, 1): (10, False)}


def test_a_single_candidate_is_no_tie_but_two_equal_draws_are():
    one = [rec("A", [0], 0, 0, 5, [.3, .9], [.5, .5])]
    assert not select(pd.DataFrame(one), "oracle")["tied"].iloc[0]
    two = one + [rec("A", [0], 1, 0, 5, [.4, .9], [.5, .5])]  # a second draw, same test-domain out accuracy
    chosen = select(pd.DataFrame(two), "oracle")
    assert chosen["tied"].tolist() == [True] and chosen["hparams_seed"].tolist() == [1]  # DomainBed: largest seed
    assert not select(pd.DataFrame(two), "last")["tied"].iloc[0]  # `last` compares nothing


def test_marks_and_footnotes_in_markdown():
    collection = marked_collection()
    tables = build_tables(collection, ["training"])
    md = to_markdown(tables, collection)
    test_row = next(line for line in md.splitlines() if line.startswith("| ERM"))
    # test accuracy .40 + step / 100 + trial / 10 at the selected steps; ± = std(x / sqrt(2)) = |a - b| / 2 / sqrt(2)
    # env 0: steps 0, 10 -> .40, .60; env 1: steps 10, 20 -> .50, .70; env 2: steps 10, 10 -> .50, .60
    assert [c.strip() for c in test_row.split("|")[2:5]] == ["50.0 ± 7.1 †", "60.0 ± 7.1 ‡", "55.0 ± 3.5"]
    assert md.count(f"{STEP0} {MARKS[STEP0]}.") == 2  # under the test table and the in-domain table
    assert md.count(f"{TIED} {MARKS[TIED]}.") == 2


def test_marks_and_footnotes_in_latex_and_csv():
    collection = marked_collection()
    tables = build_tables(collection, ["training"])
    tex = to_latex(tables, collection)
    assert r"50.0 $\pm$ 7.1$^\dagger$ & 60.0 $\pm$ 7.1$^\ddagger$ & 55.0 $\pm$ 3.5 &" in tex
    # both tables carry the marks; a document explains each once, under its first table
    assert tex.count(r"$^\dagger$ in at least one trial selection chose step 0") == 1
    assert tex.count(r"$^\ddagger$ in at least one trial every candidate") == 1
    assert tex.index(r"$^\ddagger$ in at least one trial every candidate") < tex.index(r"\end{table")
    # a table alone explains its own
    assert r"$^\dagger$ in at least one trial selection chose step 0" in latex_table(tables[1])
    csv = pd.read_csv(io.StringIO(to_csv(tables)), keep_default_na=False)
    test = csv[csv["table"] == "test"].set_index("column")
    assert test.loc["+90%", "marks"] == STEP0 and test.loc["+90%", "step0_trials"] == 1
    assert test.loc["+90%", "note"] == "step 0 selected in 1 of 2 trials"
    assert test.loc["+80%", "marks"] == TIED and test.loc["+80%", "tied_trials"] == 1
    assert test.loc["+80%", "note"] == "every candidate tied in 1 of 2 trials"
    assert test.loc["-90%", "marks"] == "" and test.loc["-90%", "step0_trials"] == 0


def test_report_tables_carry_the_marks_and_footnotes():
    from domaingen.inspect.report import table_html

    table = build_tables(marked_collection(), ["training"])[0]
    page = table_html(table, table.caption())
    assert "50.0 ± 7.1 †</td>" in page and "60.0 ± 7.1 ‡</td>" in page and "55.0 ± 3.5</td>" in page
    assert f'<p class="note">{STEP0} {MARKS[STEP0]}.</p>'.replace("'", "&#x27;") in page


# ---- ± defined once, with the trial count -----------------------------------------------------------


def test_error_bar_defined_with_trial_count_in_every_format():
    collection = marked_collection()
    tables = build_tables(collection, ["training"])
    definition = ERROR_TITLES["domainbed"] + "; n = 2 trials per cell"
    assert definition + "; Avg columns" in to_markdown(tables, collection)
    tex = to_latex(tables, collection)
    # once per document, under the first table, inside its float; the formulas typeset
    definition = (r"$\pm$ = DomainBed's error bar over the $n$ trials of a cell, $\mathrm{std}(x/\sqrt{n})$ with ddof 0 "
                  r"(the sample standard error times $\sqrt{(n-1)/n}$); $n$ = 2 trials per cell")
    assert tex.count(definition) == 1 and len(tables) == 2
    assert tex.index(definition) < tex.index(r"\end{table")
    csv = pd.read_csv(io.StringIO(to_csv(tables, error="se")))
    assert set(csv["error_definition"]) == {"sample standard error over the n trials of a cell, std(x) / sqrt(n) with ddof 1"}
    assert set(csv["n"][csv["column"] != "Avg"]) == {2}


def test_trial_count_says_a_range_and_one_trial():
    one = Collection(pd.DataFrame([rec("A", [0], 0, 0, 5, [.3, .9], [.5, .5])]))
    assert trial_counts(build_tables(one, ["training"])) == "n = 1 trial per cell (no ±)"
    rows = [rec("A", [0], 0, t, 5, [.3, .9], [.5, .5]) for t in range(3)] + [rec("A", [1], 0, 0, 5, [.9, .3], [.5, .5])]
    text = trial_counts(build_tables(Collection(pd.DataFrame(rows)), ["training"]))
    assert text == "n = 1 to 3 trials per cell (--show_trials prints each cell's n)"


def test_report_bars_use_the_tables_error_bar():
    plt = pytest.importorskip("matplotlib.pyplot")
    from domaingen.inspect.report import accuracy_bars

    table = build_tables(marked_collection(), ["training"])[0]
    figure = accuracy_bars(table, plt)
    plt.close(figure.figure)
    assert ERROR_TITLES["domainbed"] + "; n = 2 trials per cell." in figure.caption
    # the drawn bar is the table's ±, DomainBed's std(x / sqrt(n)) with ddof 0: trials .40 and .60 give .1 / sqrt(2),
    # not the sample standard error .1
    assert figure.data["bars"]["ERM"]["error"] == pytest.approx([100 * .1 / 2 ** .5, 100 * .1 / 2 ** .5, 100 * .05 / 2 ** .5])


def test_report_bars_draw_no_error_bar_for_a_one_trial_cell():
    plt = pytest.importorskip("matplotlib.pyplot")
    from matplotlib.container import BarContainer

    from domaingen.inspect.report import accuracy_bars

    # env 0 held out in trials at .40 and .60; env 1 in one trial only
    rows = [rec("A", [0], 0, t, 5, [.4 + .2 * t, .9], [.5, .5]) for t in range(2)] + [rec("A", [1], 0, 0, 5, [.9, .3], [.5, .5])]
    table = build_tables(Collection(pd.DataFrame(rows)), ["training"])[0]
    figure = accuracy_bars(table, plt)
    # the error bar's drawn segment per bar (its two ends), none where nothing is drawn
    (bars,) = [c for c in figure.figure.axes[0].containers if isinstance(c, BarContainer)]
    segments = bars.errorbar.lines[2][0].get_segments()
    caps_y = np.array([float(y) for cap in bars.errorbar.lines[1] for y in cap.get_ydata()])
    plt.close(figure.figure)
    (low, high), one_trial = segments
    assert (high[1] - low[1]) / 2 == pytest.approx(100 * .1 / 2 ** .5)  # DomainBed's std(x / sqrt(n)), ddof 0
    assert len(one_trial) == 0 and figure.data["bars"]["A"]["error"][1] == 0.0  # one trial: no bar
    assert np.isfinite(caps_y).sum() == 2  # and no cap: the two caps are the first bar's


# ---- LaTeX minus ---------------------------------------------------------------------------------


def test_latex_typesets_a_leading_minus_as_a_minus():
    assert latex_escape("-90%") == r"$-$90\%"
    assert latex_escape("Avg (+90%, -90%)") == r"Avg (+90\%, $-$90\%)"
    assert latex_escape("+90%") == r"+90\%" and latex_escape("ERM-2") == "ERM-2" and latex_escape("1e-4") == "1e-4"


@pytest.mark.skipif(__import__("shutil").which("pdflatex") is None, reason="pdflatex not installed")
def test_marked_tables_and_notes_compile(tmp_path):
    import subprocess

    collection = marked_collection()
    (tmp_path / "t.tex").write_text(to_latex(build_tables(collection, ["training", "oracle"]), collection))
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "Missing character" not in (tmp_path / "t.log").read_text()
