"""Table formats: LaTeX that compiles, Markdown and CSV that carry the same numbers."""

from __future__ import annotations

import io
import shutil
import subprocess

import pandas as pd
import pytest

from domaingen.tables.collect import Collection
from domaingen.tables.reporting import build_tables, latex_escape, to_csv, to_latex, to_markdown
from test_selection import rec


@pytest.fixture
def collection() -> Collection:
    rows = []
    for trial, accs in enumerate([(.6, .2, .7), (.8, .4, .5)]):
        for env, acc in enumerate(accs):
            ins = [.9, .9, .9]
            ins[env] = acc
            rows.append(rec("ERM_x", [env], 0, trial, 1, ins, [.5, .5, .5], dataset="ColoredMNIST"))
    return Collection(pd.DataFrame(rows))


def test_latex_escapes_special_characters():
    assert latex_escape("+90%") == r"+90\%"
    assert latex_escape("a_b & c#") == r"a\_b \& c\#"
    assert latex_escape("ERM+ModReg \u2212 ERM") == r"ERM+ModReg $-$ ERM"  # collect --paired's labels


def test_latex_document_structure(collection):
    doc = to_latex(build_tables(collection, ["training"]), collection)
    assert doc.startswith(r"\documentclass{article}") and r"\usepackage{booktabs}" in doc
    assert doc.count(r"\begin{table") == doc.count(r"\end{table") == 2  # one dataset: no averages table
    assert r"\toprule" in doc and r"\midrule" in doc and r"\bottomrule" in doc
    assert r"+90\%" in doc and r"ERM\_x" in doc
    assert r"70.0 $\pm$ 7.1" in doc  # env 0: trials .6 and .8; DomainBed's error bar, std(x / sqrt(2))
    bare = to_latex(build_tables(collection, ["training"]), collection, bare=True)
    assert r"\documentclass" not in bare and r"\begin{tabular}" in bare


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
def test_latex_document_compiles(collection, tmp_path):
    (tmp_path / "t.tex").write_text(to_latex(build_tables(collection, ["training", "oracle"]), collection))
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (tmp_path / "t.pdf").stat().st_size > 1000


def test_markdown_and_csv_agree(collection):
    tables = build_tables(collection, ["training"])
    md = to_markdown(tables, collection)
    assert "| ERM_x       | 70.0 ± 7.1 | 30.0 ± 7.1 | 60.0 ± 7.1 | 53.3  |" in md
    csv = pd.read_csv(io.StringIO(to_csv(tables)))
    row = csv[(csv["table"] == "test") & (csv["column"] == "+80%")].iloc[0]
    assert row["mean"] == pytest.approx(.3) and row["se"] == pytest.approx(.1) and row["n"] == 2
