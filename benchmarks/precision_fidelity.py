"""How far a decoding precision moves a model from its own fp32 arithmetic, with no search in
between: every reference translation teacher-forced through the fp32 model and through the same
model converted to each `--precisions` (`aiayn.decoding.precision.convert`), and at every target
position (EOS included):
- KL(p_fp32 || p_prec), in millinats per position;
- whether the most likely next token differs (argmax moved), in percent of positions.

    .venv/bin/python benchmarks/precision_fidelity.py --model runs/m30k/model \\
        --src runs/m30k/data/valid.src.txt --ref runs/m30k/data/valid.tgt.txt \\
        --precisions bf16 int8 --baseline ../before --out runs/fidelity.json

Why: a test set's sacreBLEU moves by 0.1-0.2 under changes far smaller than a precision's (random
weight noise of int8's rounding size moved Multi30k's test sacreBLEU by up to 0.1 and its
validation set's by up to 0.21 across six seeds: docs/experiments/decoding.md), so comparing
two arithmetics by sacreBLEU alone mostly compares their luck. These two figures have no search
and no luck in them; they rank arithmetics that sacreBLEU cannot tell apart.

Each row is its own process (`--child`), importing the aiayn of its checkout (this one, and with
`--baseline DIR` another, e.g. a `git worktree` of an earlier commit): before and after a change
in one run. `--int8-levels 63` measures int8 as an AVX2 CPU computes it (63 activation levels,
aiayn/decoding/int8.py) on a CPU that would take 127. Sentences go through in batches of `--batch`
(sorted by length), at 2 threads unless `--threads` says otherwise; the figures do not depend on
either (rows do not mix).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def divergence(ref_logp, got_logp, keep) -> tuple[float, int, int]:
    """Over the positions `keep` (..., ) bool marks: the summed KL(ref || got) in nats, the
    number of positions, and how many have another argmax. ref_logp, got_logp: (..., V)
    log-probabilities (float); a token with ref probability 0 adds nothing."""
    import torch

    p = ref_logp.exp()
    kl = torch.where(p > 0, p * (ref_logp - got_logp), torch.zeros_like(p)).sum(-1)  # (...,)
    moved = ref_logp.argmax(-1) != got_logp.argmax(-1)  # (...,)
    return float(kl[keep].sum()), int(keep.sum()), int(moved[keep].sum())


def batches(model_dir: str, src: str, ref: str, limit: int | None, batch: int):
    """(loaded fp32 model, [Batch]): the pairs tokenized as the model's tokenizers do, in batches
    of up to `batch` pairs of similar length (`length_batches`, `collate`: what evaluation uses)."""
    from aiayn.data.batching import collate, length_batches
    from aiayn.data.model_dir import load_model

    loaded = load_model(model_dir)
    srcs = Path(src).read_text(encoding="utf-8").splitlines()[:limit]
    refs = Path(ref).read_text(encoding="utf-8").splitlines()[:limit]
    if len(srcs) != len(refs):
        raise SystemExit(f"{src} has {len(srcs)} lines but {ref} has {len(refs)}")
    pairs = list(zip(loaded.src_tokenizer.encode_batch(srcs),
                     loaded.tgt_tokenizer.encode_batch(refs)))
    groups = length_batches([len(p[0]) for p in pairs], 1 << 30, [len(p[1]) for p in pairs],
                            max_sentences=batch)
    return loaded, [collate(pairs, g) for g in groups]


def log_probs(model, data) -> list:
    """The model's next-token log-probabilities (B, T, V) float32 at every target position."""
    import torch

    with torch.inference_mode():
        return [model(b.src, b.tgt_in).float().log_softmax(-1) for b in data]


def child(a: argparse.Namespace) -> int:
    """One precision against fp32 with this process's aiayn: a JSON line on stdout."""
    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.decoding.precision import convert, resolve
    from aiayn.errors import UserError
    from aiayn.special import PAD_ID

    torch.set_num_threads(a.threads)
    try:
        loaded, data = batches(a.model, a.src, a.ref, a.limit, a.batch)
    except UserError as e:
        raise SystemExit(str(e)) from None
    except OSError as e:
        raise SystemExit(f"{e.filename}: {e.strerror}") from None
    ref = log_probs(loaded.model.eval(), data)
    precision = resolve(a.child, "cpu")
    model = load_model(a.model).model.eval()
    if precision == "int8" and a.int8_levels:
        from aiayn.decoding.int8 import cpu_flags, projection_kernel, quantize_model

        model = quantize_model(model, a.int8_levels, projection_kernel(cpu_flags()))
    got = log_probs(convert(model, precision), data)
    kl = n = moved = 0
    for r, g, b in zip(ref, got, data):
        k, c, m = divergence(r, g, b.tgt_out != PAD_ID)
        kl, n, moved = kl + k, n + c, moved + m
    if precision == "int8" and a.int8_levels:
        precision = f"int8, {a.int8_levels} levels"
    print(json.dumps({"precision": precision, "positions": n, "kl_mnats": 1000 * kl / n,
                      "argmax_moved_pct": 100 * moved / n}))
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--ref", required=True)
    p.add_argument("--precisions", nargs="+", default=["bf16", "int8"])
    p.add_argument("--limit", type=int, default=None, help="the first N pairs only")
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--int8-levels", type=int, choices=[63, 127],
                   help="int8 rows with this many activation levels instead of this CPU's (63 is "
                        "what an AVX2 CPU runs; the integer sums are exact on either)")
    p.add_argument("--baseline", type=Path, metavar="DIR",
                   help="measure again with the aiayn of checkout DIR (rows 'baseline: ...')")
    p.add_argument("--out", type=Path, help="write the rows as JSON here (refuses to overwrite)")
    p.add_argument("--child", metavar="PRECISION", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    if a.out is not None and a.out.exists():
        raise SystemExit(f"{a.out} exists; choose another --out")
    rows = []
    for repo, prefix in [(REPO, "")] + ([(a.baseline.resolve(), "baseline: ")] if a.baseline else []):
        for precision in a.precisions:
            cmd = [sys.executable, str(HERE / "precision_fidelity.py"), "--child", precision,
                   "--model", a.model, "--src", a.src, "--ref", a.ref, "--batch", str(a.batch),
                   "--threads", str(a.threads)] + (["--limit", str(a.limit)] if a.limit else [])
            if a.int8_levels:
                cmd += ["--int8-levels", str(a.int8_levels)]
            env = dict(os.environ, PYTHONPATH=str(repo), PYTHONWARNINGS="ignore")
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                tail = done.stderr.strip().splitlines()
                raise SystemExit(f"{prefix}{precision}: {tail[-1] if tail else 'failed'}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["system"] = f"{prefix}{row['precision']}"
            rows.append(row)
            print(f"{row['system']:24s} KL {row['kl_mnats']:7.3f} mnats/position   argmax moved "
                  f"{row['argmax_moved_pct']:6.3f}% of {row['positions']:,} positions", flush=True)
    if a.out is not None:
        from aiayn.files import atomic_write

        from provenance import stamp, tree

        with atomic_write(a.out) as f:
            json.dump({**stamp(), "model": a.model, "src": a.src, "ref": a.ref,
                       "baseline_commit": tree(a.baseline.resolve())[0] if a.baseline else None,
                       "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
