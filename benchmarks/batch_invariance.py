"""Whether a sentence's numbers depend on the batch it is decoded in: for the first N sentences of
a file, the encoder output and the first few decoder steps' logits of the whole batch, compared
bit for bit with the same sentence encoded and decoded alone, with the source positions rounded
up to each multiple asked (`aiayn.decoding.common.source_batch`'s `multiple`; the default,
`SOURCE_MULTIPLE`, is what `translate` and `serve` use).

    .venv/bin/python benchmarks/batch_invariance.py --model runs/m30k/model \
        --src runs/m30k/data/test.src.txt --precision bf16 --multiples 1 16

Prints, per multiple, how many sentences' encoder outputs differ from their lone encoding, and
how many differ in any of `--steps` decoder steps (each fed the same tokens, over the batch's own
encoder output cut to the sentence, so the decoder alone is measured). A sentence whose numbers
differ can, at a near tie, get another translation in `serve` (whose batches are whoever is
waiting) than in `translate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def count_differing(model, sources: list[list[int]], multiple: int, steps: int) -> tuple[int, int]:
    """(sentences whose encoder output differs, sentences whose decoder steps differ) between the
    batch of all `sources` and each sentence alone."""
    import torch

    from aiayn.decoding import source_batch
    from aiayn.special import BOS_ID, EOS_ID

    feed = [BOS_ID] + [EOS_ID + 1 + i for i in range(steps - 1)]  # ordinary pieces, alike for every row
    with torch.inference_mode():
        src, mask = source_batch(sources, multiple=multiple)
        memory = model.encode(src, mask)  # (B, S, d_model)
        cache = model.new_cache(memory, mask)
        batch_steps = [model.decode_step(torch.full((len(sources), 1), t), cache) for t in feed]
        enc_differ = dec_differ = 0
        for i, ids in enumerate(sources):
            one, one_mask = source_batch([ids], multiple=multiple)
            n = len(ids) + 1  # pieces + EOS
            enc_differ += not torch.equal(memory[i, :n], model.encode(one, one_mask)[0, :n])
            own = memory[i : i + 1, : one.size(1)].contiguous()  # the batch's rows, as decoded there
            alone_cache = model.new_cache(own, one_mask)
            alone = [model.decode_step(torch.full((1, 1), t), alone_cache) for t in feed]
            dec_differ += not all(torch.equal(b[i], a[0]) for b, a in zip(batch_steps, alone))
    return enc_differ, dec_differ


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--src", required=True, help="source sentences, one per line")
    p.add_argument("--sentences", type=int, default=100, help="the first N lines (default 100)")
    p.add_argument("--precision", default="bf16", choices=["fp32", "bf16", "int8"])
    p.add_argument("--multiples", type=int, nargs="+", default=[1, 16])
    p.add_argument("--steps", type=int, default=4, help="decoder steps compared (default 4)")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    import torch

    from aiayn.data.model_dir import load_model
    from aiayn.decoding.precision import convert

    torch.set_num_threads(a.threads)
    loaded = load_model(a.model)
    model = convert(loaded.model, a.precision)
    lines = Path(a.src).read_text(encoding="utf-8").splitlines()[: a.sentences]
    sources = [ids for ids in (loaded.src_tokenizer.encode(line) for line in lines) if ids]
    print(f"{a.model}, {a.precision}, {len(sources)} sentences, {a.steps} decoder steps")
    print("| source positions a multiple of | encoder outputs unlike alone | decoder steps unlike alone |")
    print("|---:|---:|---:|")
    for m in a.multiples:
        enc, dec = count_differing(model, sources, m, a.steps)
        print(f"| {m} | {enc} of {len(sources)} | {dec} of {len(sources)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
