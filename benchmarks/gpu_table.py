"""The markdown table of a benchmarks/train_gpu.sh run, for docs/experiments/wmt.md: per model and
system, target tokens/s, MFU against the GPU's measured bf16 matmul peak and its datasheet peak,
peak memory, and each aiayn row's speed against torch.nn.Transformer's best row of that model;
the matmul row's commit, tree state and host CPU (benchmarks/provenance.py) on a line of its own.

    python3 benchmarks/gpu_table.py runs/gpu/train_gpu.jsonl 989.4 > runs/gpu/train_gpu.md
"""

from __future__ import annotations

import json
import sys

from provenance import stamp_line


def table(rows: list[dict], datasheet_tflops: float) -> str:
    peak = next((r for r in rows if r.get("system") == "matmul"), {})
    measured = peak.get("tflops")
    head = [f"GPU: {peak.get('gpu', '?')}; torch {peak.get('torch', '?')}; bf16 matmul peak "
            f"{measured} TFLOP/s measured (8192^3), {datasheet_tflops} datasheet",
            stamp_line(peak), "",
            "| model | system | target tok/s | MFU (measured peak) | MFU (datasheet) | peak memory GB "
            "| against torch's best |", "|---|---|---|---|---|---|---|"]
    lines = []
    runs = [r for r in rows if r.get("system") in ("aiayn", "torch")]
    for config in ("base", "big"):
        mine = [r for r in runs if r.get("config") == config]
        best_torch = max((r.get("tok_per_s", 0) for r in mine if r["system"] == "torch"), default=0)
        for r in mine:
            name = (r["system"] + (" compiled" if r.get("compiled") else " eager")
                    + (", eager loss" if r.get("eager_loss") else ""))
            if "failed" in r:
                lines.append(f"| {config} | {r['system']} | {r['failed']} | | | | |")
                continue
            flops = r["tok_per_s"] * r["flops_per_tok"]
            mfu_m = f"{100 * flops / (measured * 1e12):.1f}%" if measured else "-"
            ratio = f"{r['tok_per_s'] / best_torch:.2f}x" if best_torch and r["system"] == "aiayn" else ""
            lines.append(f"| {config} | {name} | {r['tok_per_s']:,.0f} | {mfu_m} | "
                         f"{100 * flops / (datasheet_tflops * 1e12):.1f}% | {r['peak_gpu_mem_gb']} "
                         f"| {ratio} |")
    return "\n".join(head + lines)


def main() -> int:
    path, datasheet = sys.argv[1], float(sys.argv[2])
    rows = [json.loads(line) for line in open(path, encoding="utf-8") if line.strip().startswith("{")]
    print(table(rows, datasheet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
