"""benchmarks/bench_peers.py's report: ratios, a machine without native bf16, and the run history.

Nothing is measured here; the rows are made up, so only the arithmetic and the files are checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from helpers import REPO


def bench_peers(run: dict, tmp_path: Path, *args: str) -> str:
    """`bench_peers.py --render` of a saved run (nothing measured): what it prints."""
    saved = tmp_path / f"run-{run['date'][:10]}.json"
    saved.write_text(json.dumps(run))
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_peers.py"), "--render",
                           str(saved), *args], capture_output=True, text=True, check=True)
    return done.stdout


def fake_run(date: str, isa: str) -> dict:
    def row(system, precision, tok, rss_mb):
        return {"config": "tiny", "system": system, "precision": precision,
                "train": {"tok_per_s": tok, "flops_per_tok": 46e6, "peak_rss_mb": rss_mb}}
    return {"date": date, "machine": {"cpu": "Test CPU", "isa": isa, "nproc": 2}, "cpus": "0,1",
            "threads": 2, "python": "python", "command": "bench_peers.py", "configs": ["tiny"],
            "versions": {"torch": "x", "aiayn": "y"}, "peak": {"threads": 2, "fp32_gflops": 100.0},
            "rows": [row("aiayn", "fp32", 3000.0, 1024.0), row("opennmt", "fp32", 2000.0, 2048.0),
                     row("fairseq", "fp32", 2500.0, 1024.0)]}


def test_fp32_only_run_renders_ratios_against_the_fastest_peer(tmp_path):
    text = bench_peers(fake_run("2026-01-01T00:00:00", "avx2"), tmp_path)
    assert "bf16 not measured" in text
    # speed 3000/2000, MFU 2000 x 46e6 / 100e9, no decoding rows, RSS 2 GB against aiayn's 1 GB
    assert "| OpenNMT-py | fp32 | 2000 (1.50) | 0.92 (1.50) | - | - | 2.00 (0.50) | - |" in text
    assert "fairseq fp32 (2,500 tok/s): aiayn fp32 1.20x" in text


def test_record_keeps_each_machine_and_points_to_the_earlier_runs(tmp_path):
    root = tmp_path / "benchmarks"
    record = ["--write-results", "--results-dir", str(root)]
    bench_peers(fake_run("2026-01-01T00:00:00", "avx2, avx512f, amx_bf16"), tmp_path, *record)
    (root / "results" / "train-gpu-2026-01-01-h100.md").write_text("# a GPU table\n")
    bench_peers(fake_run("2026-01-02T00:00:00", "avx2"), tmp_path, *record)
    kept = sorted(p.name for p in (root / "results").iterdir())
    assert kept == ["2026-01-01-avx2-avx512f-amx-bf16.md", "2026-01-02-avx2.md",
                    "train-gpu-2026-01-01-h100.md"]
    latest = (root / "RESULTS.md").read_text()
    assert "- Date: 2026-01-02" in latest and "(avx2)" in latest
    earlier, gpu = latest.split("Earlier runs")[1].split("Training on one GPU")
    assert "[2026-01-01-avx2-avx512f-amx-bf16.md](results/2026-01-01-avx2-avx512f-amx-bf16.md)" in earlier
    assert "train-gpu" not in earlier  # the GPU tables are listed as such, not as CPU runs
    assert "[train-gpu-2026-01-01-h100.md](results/train-gpu-2026-01-01-h100.md)" in gpu


def test_decoding_summary_compares_each_aiayn_precision_with_ctranslate2(tmp_path):
    def dec(system, precision, sent, rss_mb):
        return {"config": "tiny", "system": system, "precision": precision,
                "decode": {"greedy_sent_per_s": 2 * sent, "beam4_sent_per_s": sent,
                           "peak_rss_mb": rss_mb}}
    run = fake_run("2026-01-01T00:00:00", "avx2")
    run["rows"] += [dec("aiayn", "int8", 80.0, 300.0), dec("ctranslate2", "fp32", 50.0, 250.0),
                    dec("ctranslate2", "int8", 64.0, 200.0)]
    text = bench_peers(run, tmp_path)
    # 80/64 and 80/50 sentences/s, 300/200 MB; aiayn fp32 has no decoding row, so no entry
    assert "against CTranslate2 int8 / fp32: aiayn int8 1.25x / 1.60x (decoding RSS 1.50x" in text
    assert "aiayn fp32 " not in text.split("Beam-4 decoding")[1]
    # against aiayn int8, the same precision: 160/128 greedy, 80/64 beam, 300/200 MB
    assert "| CTranslate2 | int8 | - | - | 128 (1.25) | 64 (1.25) | - | 0.20 (1.50) |" in text
