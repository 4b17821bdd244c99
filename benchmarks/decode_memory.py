"""Where decoding's memory goes: `Translator.translate` of a file in this process, with the
resident set size (RSS, /proc/self/statm) and the decoding state's sizes read after every
decoder step; prints the phases (torch imported, model loaded) and the step at the RSS peak.

    .venv/bin/python benchmarks/decode_memory.py --model runs/m30k/model --src data/test.src.txt

At the peak step it reports the batch's rows (sentences x beams), the positions decoded, and the
bytes of the key/value cache (self-attention buffers, their spare, the cross-attention keys and
values) and of one step's logits (rows x vocabulary, float32; the search holds a few such
tensors at once). What RSS holds beyond those is the allocator's: memory freed by earlier
batches and kept. Run it with the allocator to study (`AIAYN_ALLOCATOR` does not apply here:
this script does not restart itself; preload mimalloc with LD_PRELOAD to study it).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def mb(tensors) -> float:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True)
    p.add_argument("--precision", default="fp32")
    p.add_argument("--batch-tokens", type=int, default=4000)
    p.add_argument("--early-stop", default="exact")
    args = p.parse_args(argv)
    from aiayn.memory import tune_memory

    tune_memory()  # as the CLI does, before torch is imported
    start = rss_mb()
    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator

    phases = [("python started", start), ("torch imported", rss_mb())]
    loaded = load_model(args.model)
    tr = Translator(loaded, precision=args.precision, batch_tokens=args.batch_tokens,
                    early_stop=args.early_stop)
    phases.append(("model loaded and converted", rss_mb()))
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    cls = type(tr.model)
    step = cls.decode_step
    steps = []

    def recorded(self, tokens, cache, **kwargs):
        out = step(self, tokens, cache, **kwargs)
        logits = out[0] if isinstance(out, tuple) else out
        steps.append({"rss": rss_mb(), "rows": tokens.size(0), "positions": cache.length,
                      "self": mb([*cache.self_k, *cache.self_v]), "spare": mb([cache._spare]),
                      "cross": mb([cache.cross_k, cache.cross_v]),
                      "logits": logits.numel() * 4 / 2**20})
        return out

    cls.decode_step = recorded
    try:
        tr.translate(lines)
    finally:
        cls.decode_step = step
    peak = max(steps, key=lambda s: s["rss"])
    print(f"{len(lines)} sentences, precision {args.precision}, --batch-tokens "
          f"{args.batch_tokens}, --early-stop {args.early_stop}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, allocator: "
          f"{'mimalloc' if 'mimalloc' in os.environ.get('LD_PRELOAD', '') else 'the C library'}")
    for name, value in phases:
        print(f"  {name:<28} {value:7.0f} MB RSS")
    print(f"  peak during decoding         {peak['rss']:7.0f} MB RSS, at a step with "
          f"{peak['rows']} rows, {peak['positions']} positions decoded")
    print(f"    self-attention cache       {peak['self']:7.1f} MB (+ spare {peak['spare']:.1f} MB)")
    print(f"    cross-attention keys/values {peak['cross']:6.1f} MB")
    print(f"    one step's logits          {peak['logits']:7.1f} MB")
    print(f"  largest cache at any step    {max(s['self'] + s['spare'] for s in steps):7.1f} MB; "
          f"most rows {max(s['rows'] for s in steps)}")
    print(f"  peak RSS of the process      {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:7.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
