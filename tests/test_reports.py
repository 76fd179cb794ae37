"""workbook.reports.compare_methods: one call from a grid of runs to the table beside the paper, the figure
and the timings; the CSV notes state the settings of the runs behind each file (not another table's).
committed_table: what a notebook shows for a check kept out of the main job."""

from pathlib import Path

import pandas as pd
import pytest
import torch

from fda_core.common import files
from fda_core.common.files import write_table
from fda_core.common.store import ResultStore
from fda_core.data import datasets
from fda_core.workbook.reports import auto_beta_report, committed_table, compare_methods, data_description


class Blobs(datasets.FDADataset):
    """Three small environments of class-dependent blobs (DomainBed interface)."""

    ENVIRONMENTS = ["e0", "e1", "e2"]
    input_shape = (1, 4, 4)
    num_classes = 3
    name = "TestBlobs"

    def __init__(self, n: int = 120, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        for e in range(3):
            y = torch.randint(0, 3, (n,), generator=g)
            x = torch.randn(n, 1, 4, 4, generator=g) + (y[:, None, None, None] - 1) * (0.6 + 0.4 * e)
            self.datasets.append((x, y))
        self.n, self.seed = n, seed

    def describe(self) -> str:
        return f"TestBlobs of {self.n} examples per environment, seed {self.seed}."


@pytest.fixture(autouse=True)
def blobs():
    datasets.register_dataset("TestBlobs", Blobs, overwrite=True)
    yield
    datasets._REGISTRY.pop("TestBlobs")


BASE = dict(dataset="TestBlobs", rounds=3, warmup_rounds=1, n_target_labeled=24, target_batch_size=6, model="mlp",
            source_batch_size=32)


def test_compare_methods_writes_table_figure_and_generated_notes(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "project_root", lambda: tmp_path)  # timings into tmp_path, not the checkout
    store = ResultStore(tmp_path / "results")
    a = compare_methods(["fedgp", {"fedgp": {"beta": 1.0}}, "fedgp_auto", "target_only"], {**BASE, "source_lr": 0.02},
                        across="target", targets=["e0", "e2"], seeds=[0, 1], experiment="a", store=store,
                        out_dir=tmp_path / "fig", table_name="a_table", figure_name="a_fig", plot="bars",
                        note="data: blobs", progress=False, timings_stem="test_reports")
    assert list(a.means.index) == ["FedGP", "FedGP (β=1)", "FedGP_Auto", "Target only"]
    assert list(a.means.columns) == ["e0", "e2", "Avg"] and len(a.runs) == 16
    assert "seconds" not in a.runs.columns  # wall-clock times are kept out of result tables
    text = (tmp_path / "fig" / "a_table.csv").read_text()
    note = [line for line in text.splitlines() if line.startswith("#")]
    assert any("source_lr=0.02" in line for line in note) and any("data: blobs" in line for line in note)
    assert any("target in [e0, e2]" in line for line in note) and any("seed in [0, 1]" in line for line in note)
    table = pd.read_csv(tmp_path / "fig" / "a_table.csv", comment="#").set_index("method")
    assert table.loc["FedGP (β=1)", "e2"] == pytest.approx(a.means.loc["FedGP (β=1)", "e2"], abs=0.005)
    for ext in ("png", "pdf", "csv"):
        assert (tmp_path / "fig" / f"a_fig.{ext}").exists()
    assert (tmp_path / "executed" / "timings" / "test_reports" / "a_table.csv").exists()
    assert "0 run(s) reused" in a.store_summary and "16 computed" in a.store_summary
    # a second comparison with other settings writes its own settings, never the first one's
    b = compare_methods(["fedda"], {**BASE, "source_lr": 0.05, "rounds": 2}, across="target", targets=["e1"],
                        experiment="b", store=store, out_dir=tmp_path / "fig", table_name="b_table", progress=False)
    b_note = (tmp_path / "fig" / "b_table.csv").read_text()
    assert "source_lr=0.05" in b_note and "rounds=2" in b_note and "source_lr=0.02" not in b_note
    assert b.figure is None
    # re-running reuses the stored runs of the same code, and says so
    again = compare_methods(["fedda"], {**BASE, "source_lr": 0.05, "rounds": 2}, across="target", targets=["e1"],
                            experiment="b", store=ResultStore(tmp_path / "results"), progress=False)
    assert "1 run(s) reused" in again.store_summary and again.means.equals(b.means)
    betas = auto_beta_report(a, out_dir=tmp_path / "fig", figure_name="betas")
    assert set(betas["rule"]) == {"fedgp_auto"} and betas["beta"].between(0, 1).all()
    assert (tmp_path / "fig" / "betas.png").exists()


def test_the_notes_describe_the_data_set_of_the_first_run_and_say_when_there_are_more(tmp_path):
    """``describe_data``: the CSV note gives the description of the data set the first run used (built from its
    resolved config: the variant's options, the trial's seed under ``data_seed="per_trial"``), before ``note``; where
    the runs use several data sets, it says of how many it is the first."""
    variants = [{"dataset_options": {"n": 90}}, {"dataset_options": {"n": 60}}]
    res = compare_methods(["fedda"], BASE, across="target", targets=["e0"], seeds=[3, 4], variants=variants,
                          experiment="d", describe_data=True, note="more", data_seed="per_trial", out_dir=tmp_path,
                          table_name="d", progress=False)
    note = [line.lstrip("# ") for line in (tmp_path / "d.csv").read_text().splitlines() if line.startswith("#")]
    first = note.index("TestBlobs of 90 examples per environment, seed 3.")
    assert note[first + 1] == ('The description is of the first run\'s data set, one of the 4 these runs use (the '
                               '"varies:" line gives each run\'s options).')
    assert note[first + 2] == "more" and any(line.startswith("varies: ") for line in note[:first])
    one = compare_methods(["fedda"], BASE, across="target", targets=["e0", "e1"], experiment="d", describe_data=True,
                          progress=False)
    assert "TestBlobs of 120 examples per environment, seed 0." in one.note and "one of the" not in one.note
    assert "examples per environment" not in compare_methods(["fedda"], BASE, across="target", targets=["e0"],
                                                             experiment="d", progress=False).note  # off by default
    with pytest.raises(ValueError, match="configs must hold at least one"):
        data_description([])


def test_compare_methods_beside_the_paper_and_bad_plot(tmp_path):
    res = compare_methods(["source_only", "fedgp"], BASE, across="target", targets=["e0"], experiment="c",
                          paper="ColoredMNIST", progress=False)
    assert list(res.table.columns) == ["e0", "Avg", "paper Avg"]  # the paper's columns that ours also has
    assert res.table.loc["FedGP", "paper Avg"] == 84.76
    assert "Paper: auto-weighted FDA paper, Table 1" in res.note
    with pytest.raises(ValueError, match="plot must be"):
        compare_methods(["fedgp"], BASE, across="target", targets=["e0"], experiment="c", plot="pie", progress=False)
    with pytest.raises(ValueError, match="rule must be one of"):
        compare_methods(["fedgpx"], BASE, across="target", experiment="c", progress=False)


def test_compare_methods_with_a_panel_tabulates_and_draws_each_value_of_it_apart(tmp_path):
    """``panel`` (notebook 05's Table 3 at several noise levels): rows (method, panel value), each cell the mean of
    that group's runs alone; the figure one panel per value; the CSV keeps both row columns; a bar plot with a panel
    or a panel that is ``across`` is refused, the first before any run."""
    store = ResultStore(tmp_path / "results")
    variants = [{"n_target_labeled": n, "labels": {"setting": s}} for n in (3, 24) for s in ("a", "b")]
    res = compare_methods(["fedda", "fedgp"], {**BASE, "source_lr": 0.05}, across="setting", panel="n_target_labeled", targets=["e0"],
                          variants=variants, seeds=[0, 1], experiment="p", store=store, out_dir=tmp_path / "fig",
                          table_name="p_table", figure_name="p_fig", plot="lines", title="Labelled samples",
                          average=False, progress=False)
    assert list(res.means.index) == [("FedDA", 3), ("FedDA", 24), ("FedGP", 3), ("FedGP", 24)]
    assert list(res.means.columns) == ["a", "b"] and len(res.runs) == 16
    for (method, n), row in res.means.iterrows():
        for s in ("a", "b"):
            mine = res.runs[(res.runs["method"] == method) & (res.runs["n_target_labeled"] == n) & (res.runs["setting"] == s)]
            assert len(mine) == 2 and row[s] == pytest.approx(mine["final_acc"].mean())
    assert res.means.loc[("FedDA", 3)].tolist() != res.means.loc[("FedDA", 24)].tolist()  # the panels are not pooled
    axes = res.figure.axes
    assert [ax.get_title() for ax in axes] == ["n_target_labeled 3", "n_target_labeled 24"]
    assert res.figure._suptitle.get_text() == "Labelled samples"
    table = pd.read_csv(tmp_path / "fig" / "p_table.csv", comment="#")
    assert list(table.columns) == ["method", "n_target_labeled", "a", "b"] and len(table) == 4
    with pytest.raises(ValueError, match="plot must be 'bars' \\(without panel\\)"):
        compare_methods(["fedgp"], BASE, across="setting", panel="n_target_labeled", variants=variants, plot="bars",
                        experiment="q", store=store, progress=False)
    assert not (tmp_path / "results" / "q").exists()  # refused before any run
    with pytest.raises(ValueError, match="cannot be combined with paper"):
        compare_methods(["fedgp"], BASE, across="setting", panel="n_target_labeled", variants=variants,
                        paper="ColoredMNIST", experiment="q", store=store, progress=False)
    assert not (tmp_path / "results" / "q").exists()
    for wrong in ("setting", "noise"):  # the columns' own axis, a column no run has: refused before any run
        with pytest.raises(ValueError, match="panel must be a column of the runs other than"):
            compare_methods(["fedgp"], BASE, across="setting", panel=wrong, variants=variants, experiment="q",
                            store=store, progress=False)
        assert not (tmp_path / "results" / "q").exists()


def test_compare_methods_statistic_is_a_named_option_stated_in_the_notes(tmp_path):
    """``value`` picks the per-run statistic the table shows (the auto-weighted paper's last-5 mean or the
    final round); the notes say which, and an unknown one is refused before any run."""
    kw = dict(across="target", targets=["e0"], seeds=[0, 1], experiment="s", progress=False)
    base = {**BASE, "rounds": 7, "source_lr": 0.05}
    final = compare_methods(["fedgp"], base, **kw)
    last5 = compare_methods(["fedgp"], base, value="last5_acc", out_dir=tmp_path, table_name="t", **kw)
    assert final.means.loc["FedGP", "e0"] == pytest.approx(final.runs["final_acc"].mean())
    assert last5.means.loc["FedGP", "e0"] == pytest.approx(last5.runs["last5_acc"].mean())
    assert last5.runs["last5_acc"].tolist() != last5.runs["final_acc"].tolist()  # the two statistics differ here
    assert "(final_acc)" in final.note and "(last5_acc;" in last5.note
    assert "(last5_acc;" in (tmp_path / "t.csv").read_text()
    with pytest.raises(ValueError, match="value must be one of"):
        compare_methods(["fedgp"], BASE, value="best_acc", **kw)


def test_ordering_lines_hand_made():
    """The per-setting ordering and the FedGP verdict, from a hand-made means table."""
    import pandas as pd

    from fda_core.workbook.reports import ordering_lines

    means = pd.DataFrame({"paper": [20.0, 60.0, 70.0, 66.0, 81.0], "strong": [30.0, 40.0, 35.0, 50.0, 60.0]},
                         index=["Source only", "FedDA", "FedGP (cosine)", "Target only", "Oracle"])
    lines = ordering_lines(means)
    assert lines[0] == "paper: Oracle 81.0 > FedGP (cosine) 70.0 > Target only 66.0 > FedDA 60.0 > Source only 20.0"
    assert lines[1] == "  FedGP (cosine) beats every non-oracle rival (best rival Target only 66.0)"
    assert lines[3] == "  FedGP (cosine) does not beat every non-oracle rival (best rival Target only 50.0)"
    with pytest.raises(ValueError, match="focus"):
        ordering_lines(means, focus="Ditto")


def test_a_variant_that_runs_a_method_with_other_options_gets_its_own_row(tmp_path):
    """A variant's method ``options`` (notebook 05's reference-scripts setting: Target only after the warm-up) give
    those runs their own label; the table keeps that row, after its method's, with values only in that column."""
    variants = [{"labels": {"setting": "a"}},
                {"labels": {"setting": "b"}, "options": {"target_only": {"warmup": True}}}]
    res = compare_methods(["target_only", "fedgp"], BASE, across="setting", targets=["e0"], variants=variants,
                          experiment="v", average=False, progress=False)
    assert list(res.means.index) == ["Target only", "Target only (after warm-up)", "FedGP"]
    assert res.means.loc["Target only", "b"] != res.means.loc["Target only", "b"]  # NaN: only setting a ran it
    assert res.means.loc["Target only (after warm-up)"].notna().tolist() == [False, True]

def test_committed_table_reads_the_table_its_note_and_says_where_from(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = pd.DataFrame({"method": ["FedGP", "Target only"], "0.4": [81.5, 78.25]})
    write_table(tmp_path / "check.csv", table, note="made by the check\nsecond line")
    got = committed_table(tmp_path, "check", "fda run 05 -p sections '[\"faithful\"]'")
    assert got is not None and got.path == tmp_path / "check.csv"
    assert got.table.index.name == "method" and got.table.loc["Target only", "0.4"] == 78.25
    assert got.note == ["made by the check", "second line"]
    out = capsys.readouterr().out
    assert "Not run here" in out and "fda run 05 -p sections" in out and str(tmp_path / "check.csv") in out
    runs = committed_table(tmp_path, "check", "cmd", index=False)  # a file of runs: no index column
    assert list(runs.table.columns) == ["method", "0.4"] and runs.table["method"].tolist() == ["FedGP", "Target only"]


def test_committed_table_absent_says_which_run_makes_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert committed_table(tmp_path / "elsewhere", "faithful_table", "fda run 05 -p sections '[\"faithful\"]'") is None
    out = capsys.readouterr().out
    assert "no committed faithful_table.csv" in out and "fda run 05 -p sections" in out


def test_committed_table_resolves_relative_folders_under_the_repository() -> None:
    """A relative figures_dir is the repository's, as the notebooks resolve theirs: the committed check is found."""
    got = committed_table("figures/04_real_data", "reference_budget_check", "fda run 04 -p reference_check true")
    assert got is not None and "Source only" in got.table.index
    assert got.path == Path(__file__).resolve().parent.parent / "figures" / "04_real_data" / "reference_budget_check.csv"


def test_a_sweep_reuses_a_run_another_sweep_of_the_notebook_stored(tmp_path):
    """Notebook 05's ablations repeat runs (Table 3's FedDA at 100 labels is Table 4's at the same noise): a run of
    the same config and code is computed once, whichever comparison asked first, and gives the same numbers."""
    store = ResultStore(tmp_path / "results")
    first = compare_methods(["fedda", "fedgp"], BASE, across="target", targets=["e0"], experiment="05_target_samples",
                            store=store, progress=False)
    second = compare_methods(["fedgp", {"fedgp": {"filter": False}}], BASE, across="target", targets=["e0"],
                             experiment="05_projection", store=store, progress=False)
    assert "1 run(s) reused from the result store (1 of them stored by another experiment), 1 computed" \
        in second.store_summary
    assert second.means.loc["FedGP", "e0"] == first.means.loc["FedGP", "e0"]
    assert len(list((tmp_path / "results" / "05_projection").glob("*.json"))) == 2  # the folder lists its sweep
    alone = compare_methods(["fedgp"], BASE, across="target", targets=["e0"], experiment="alone", progress=False)
    assert alone.means.loc["FedGP", "e0"] == first.means.loc["FedGP", "e0"]  # the same bits as computing it
