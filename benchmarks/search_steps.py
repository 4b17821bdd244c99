"""What a stopping rule costs: `Translator.translate` of a file in this process, timed after a
warm-up, with the search's work counted: decoder steps per sentence against its output's
length, rows decoded, the positions the cache holds at each reorder and how many rows a reorder
gives a new parent; `--profile` adds torch.profiler's table of one more pass.

    .venv/bin/python benchmarks/search_steps.py --model runs/m30k/model --src data/test.src.txt \
        --precision int8 --early-stop exact current

Counting wraps `BeamSearch.step` and `KVCache.reorder` (the search itself is unchanged; the
counted pass is not the timed one). "Steps after the answer" is a sentence's steps minus its
best hypothesis' length (EOS counted): what the stopping rule spent confirming it. Every
sentence holds `beam` rows at each of its steps, so rows decoded = beam x the steps summed
(tests/test_bench_search_steps.py checks the counts against each other). Of those rows it
counts the ones decoded for nothing (`_idle_rows`): dead (a sentence's first step, one prefix in
`beam` rows) and, under the exact rule, hopeless (a beam whose own bound already loses to its
sentence's finished answer): what skipping beams one by one, not only whole sentences, could save.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def count(translator, lines: list[str], nbest: int = 1, keep_hopeless: bool = False) -> dict:
    """Search `lines` once (`nbest` hypotheses each, kept under "answers" in input order) with
    the search's step and the cache's reorder wrapped. With `keep_hopeless`, also list each
    hopeless row's hypothesis as (line index, its tokens so far) under "hopeless_prefixes" (the
    test checks that none of them begins an answer)."""
    import torch  # imported here, as in main: torch loads after `tune_memory`

    from aiayn.decoding import beam
    from aiayn.model import cache

    seen = {"sentences": [], "rows": 0, "reorder_rows": 0, "positions": 0, "new_parent": 0,
            "shared_parent": 0, "beam": None, "dead": 0, "hopeless": 0, "hopeless_prefixes": []}
    step, reorder = beam.BeamSearch.step, cache.KVCache.reorder

    def counted_step(search):
        before = {} if search.t is None else dict(zip(search.keys, (search.t + 1).tolist()))
        seen["beam"] = search.k  # the search's own width (1 for greedy), read by the reorder
        seen["rows"] += search.rows
        if search.sentences:
            dead, hopeless = _idle_rows(search)
            seen["dead"] += int(dead.sum())
            seen["hopeless"] += int(hopeless.sum())
            if keep_hopeless:
                for i, j in hopeless.nonzero().tolist():
                    prefix = search.hist_tok[i, j, : int(search.t[i])].tolist()
                    seen["hopeless_prefixes"].append((search.keys[i], tuple(prefix)))
        done = step(search)
        for key, hyps in done:
            if key in before:
                best = hyps[0]  # its length counts EOS when it has one (not when cut off)
                seen["sentences"].append((before[key], len(best.tokens) + int(best.complete)))
        return done

    def counted_reorder(kv, index, cross_index=True):
        if kv.length:
            n = index.numel()
            seen["reorder_rows"] += n
            seen["positions"] += n * kv.filled
            seen["new_parent"] += int((index != torch.arange(n, device=index.device)).sum())
            # a beam whose parent another beam of its sentence also has: it needs a copy even
            # if every beam could take its parent's slot
            parents = index.view(-1, seen["beam"]).sort(dim=1).values  # (sentences, k)
            seen["shared_parent"] += int((parents[:, 1:] == parents[:, :-1]).sum())
        return reorder(kv, index, cross_index)

    beam.BeamSearch.step, cache.KVCache.reorder = counted_step, counted_reorder
    try:
        seen["answers"] = translator.search(translator.prepare(lines), nbest)
    finally:
        beam.BeamSearch.step, cache.KVCache.reorder = step, reorder
    return seen


def _idle_rows(search):
    """The rows this step decodes for nothing, as (n, k) bool masks (dead, hopeless). Dead rows
    hold no hypothesis (raw score -inf: a sentence's first step, whose k rows hold one prefix).
    Hopeless rows, marked under the exact rule only, hold a beam whose bound raw / lp(L) (3. in
    aiayn/decoding/beam.py's doc) is already no better than its sentence's nbest-th finished
    score: neither it nor any continuation of it can enter the answer (a continuation's raw
    score is no higher, over the same lp(L); a beam that would take its place ranks lower
    still), so skipping such beams one by one, not only whole sentences, returns the same
    answers (tried, not adopted: docs/experiments/decoding.md). Under `current` the divisor
    grows with the step, so no beam is hopeless for good, and none are marked."""
    import torch

    from aiayn.decoding.beam import cannot_win

    dead = ~torch.isfinite(search.raw)  # (n, k)
    if search.early_stop not in (True, "exact"):
        return dead, torch.zeros_like(dead)
    return dead, cannot_win(search.raw, search.bound_lp, search.pool, search.nbest) & ~dead


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True, help="source sentences, one a line")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--early-stop", nargs="+", default=["exact", "current"])
    p.add_argument("--reps", type=int, default=2, help="timed passes (fastest reported)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="torch.profiler table of one pass")
    args = p.parse_args(argv)
    from aiayn.memory import tune_memory

    tune_memory()  # as the CLI does, before torch is imported
    import torch

    from aiayn import load_model
    from aiayn.decoding.translate import Translator

    torch.set_num_threads(args.threads)
    lines = Path(args.src).read_text(encoding="utf-8").splitlines()
    loaded = load_model(args.model)  # converted once, shared by the translators below
    for rule in args.early_stop:
        tr = Translator(loaded, precision=args.precision, early_stop=rule)
        tr.translate(lines[:200])  # warm-up: first-call kernel setup
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            tr.translate(lines)
            times.append(time.perf_counter() - t0)
        c = count(tr, lines)
        steps = [s for s, _ in c["sentences"]]
        extra = [s - n for s, n in c["sentences"]]
        print(f"{args.precision}, early stop {rule}: {min(times):.2f} s for {len(lines)} lines "
              f"(fastest of {args.reps}); steps {sum(steps):,} for outputs of "
              f"{sum(n for _, n in c['sentences']):,} tokens (EOS counted); steps after the "
              f"answer {statistics.mean(extra):.1f} a sentence on average, 10 or more for "
              f"{sum(e >= 10 for e in extra) / len(extra):.0%}; rows decoded {c['rows']:,}; at a "
              f"reorder {c['positions'] / max(c['reorder_rows'], 1):.1f} positions a row, "
              f"{c['new_parent'] / max(c['reorder_rows'], 1):.0%} of rows moved, "
              f"{c['shared_parent'] / max(c['reorder_rows'], 1):.0%} sharing a parent; rows decoded "
              f"for nothing: {c['dead']:,} dead (a first step's), {c['hopeless']:,} hopeless "
              f"({(c['dead'] + c['hopeless']) / max(c['rows'], 1):.1%} of rows)")
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU]) as prof:
                tr.translate(lines)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    sys.exit(main())
