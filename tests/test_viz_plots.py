"""`aiayn plot`: what the plots read (metrics.jsonl, the Table 3 results file), worked out by hand,
and each kind of plot written as a non-empty image."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aiayn.cli import main as cli
from aiayn.errors import UserError
from aiayn.model.embedding import sinusoidal_table
from aiayn.training.schedule import learning_rate
from aiayn.viz import plots
from aiayn.viz.records import dev_seconds, read_metrics, read_study

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(run_dir):
    run_dir.mkdir(parents=True, exist_ok=True)
    records = [{"kind": "train", "step": 10, "loss": 9.0, "elapsed": 100.0},
               {"kind": "train", "step": 20, "loss": 7.0, "elapsed": 200.0},
               {"kind": "dev", "step": 20, "dev_loss": 6.5, "dev_ppl": 400.0, "dev_bleu": 1.5},
               {"kind": "train", "step": 30, "loss": 5.0, "elapsed": 400.0},
               {"kind": "skip", "step": 31, "reason": "non-finite"},
               {"kind": "train", "step": 40, "loss": 4.0, "elapsed": 500.0},
               {"kind": "dev", "step": 35, "dev_loss": 4.5, "dev_ppl": 60.0}]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"kind": "tra'  # torn last line
    (run_dir / "metrics.jsonl").write_text(text, encoding="utf-8")
    return run_dir


def test_read_metrics_by_hand(tmp_path):
    c = read_metrics(write_metrics(tmp_path / "run"))
    np.testing.assert_array_equal(c.train_step, [10, 20, 30, 40])
    np.testing.assert_array_equal(c.train_loss, [9, 7, 5, 4])
    np.testing.assert_array_equal(c.dev_step, [20, 35])
    np.testing.assert_array_equal(c.dev_ppl, [400, 60])
    assert c.dev_bleu[0] == 1.5 and np.isnan(c.dev_bleu[1])
    # step 35 lies halfway between (30, 400 s) and (40, 500 s)
    np.testing.assert_allclose(c.dev_seconds, [200.0, 450.0])
    np.testing.assert_allclose(dev_seconds(np.array([5.0, 50.0]), np.array([10.0, 20.0]),
                                           np.array([1.0, 3.0])), [1.0, 3.0])  # held at the ends
    with pytest.raises(UserError, match="no such metrics"):
        read_metrics(tmp_path / "nowhere")


def test_read_study_formats(tmp_path):
    csv = tmp_path / "t3.csv"
    csv.write_text("name,params,ppl,bleu,note\nbase,65000000,4.92,25.8,x\nA1,6.5e7,5.29,\n")
    tsv = tmp_path / "t3.tsv"
    tsv.write_text("name\tparams\tppl\tbleu\nbase\t65000000\t4.92\t25.8\nA1\t6.5e7\t5.29\t\n")
    jsonl = tmp_path / "t3.jsonl"
    jsonl.write_text('{"name": "base", "params": 65000000, "ppl": 4.92, "bleu": 25.8}\n'
                     '{"name": "A1", "params": 6.5e7, "ppl": 5.29}\n')
    study = tmp_path / "results.csv"  # the columns `aiayn study table3` writes
    study.write_text("name,row,seed,params,dev_ppl,dev_bleu,tok_s\nbase,base,1,65000000,4.92,25.8,900\n"
                     "A1,A1,1,6.5e7,5.29,,880\n")
    for path in (csv, tsv, jsonl, study):
        rows = read_study(path)
        got = [(r.name, r.params, r.ppl) for r in rows]
        assert got == [("base", 65e6, 4.92), ("A1", 65e6, 5.29)]
        assert rows[0].bleu == 25.8 and np.isnan(rows[1].bleu)
    bad = tmp_path / "bad.csv"
    bad.write_text("variant,ppl\nbase,4.9\n")
    with pytest.raises(UserError, match="name or params"):
        read_study(bad)


def test_figures_show_the_formulas():
    fig = plots.positions_figure(d_model=16, n_positions=20, dims=(4, 5))
    image = fig.axes[0].images[0].get_array()
    np.testing.assert_allclose(image, sinusoidal_table(20, 16).numpy())
    curve = fig.axes[1].lines[1].get_ydata()  # axes: table, curves, colour bar
    np.testing.assert_allclose(curve, np.cos(np.arange(20) / 10000 ** (4 / 16)), atol=1e-6)
    fig = plots.schedule_figure([(512, 4000)], steps=10000)
    line = fig.axes[0].lines[0]
    x, y = line.get_xdata(), line.get_ydata()
    np.testing.assert_allclose(y, [learning_rate(int(s), 512, 4000) for s in x])
    assert fig.axes[0].lines[1].get_xdata()[0] == 4000  # the peak's marker


@pytest.mark.slow
def test_plot_commands_write_images(tmp_path, capsys):
    run = write_metrics(tmp_path / "run")
    results = tmp_path / "t3.csv"
    results.write_text("name,params,ppl,bleu\nbase,65000000,4.92,25.8\nA1,65000000,5.29,24.9\n"
                       "big,213000000,4.33,26.4\n")
    jobs = [["positions", "--d-model", "64", "--positions", "50", "--output", "pe.png"],
            ["schedule", "--d-model", "512,256", "--warmup", "4000", "--output", "lr.svg"],
            ["curves", "--run", str(run), "--output", "curves.png"],
            ["curves", "--run", str(run / "metrics.jsonl"), "--output", "curves.pdf"],
            ["study", "--results", str(results), "--output", "t3.png"]]
    for job in jobs:
        out = tmp_path / job[-1]
        assert cli(["plot", *job[:-1], str(out)]) == 0, job
        data = out.read_bytes()
        assert len(data) > 1000
        if out.suffix == ".png":
            assert data.startswith(PNG_MAGIC)
    capsys.readouterr()
    assert cli(["plot", "positions", "--output", str(tmp_path / "pe.png")]) == 2  # exists
    assert cli(["plot", "positions", "--dims", "4,999", "--output", str(tmp_path / "x.png")]) == 2
    assert cli(["plot", "schedule", "--warmup", "4k", "--output", str(tmp_path / "x.png")]) == 2
    assert cli(["plot", "study", "--results", str(tmp_path / "no.csv"), "--output",
                str(tmp_path / "x.png")]) == 2
    assert cli(["plot", "positions", "--output", str(tmp_path / "x.gif")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 5 and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()
