"""The offline demo: grapheme-to-phoneme conversion on CMUdict, end to end on a CPU.

corpus (split by word, stress removed) -> `prepare` (characters in, phoneme symbols out: separate
vocabularies) -> `train` for a time budget -> average the last checkpoints (§6.1) -> beam search
on the held-out words -> word and phoneme error rates. The saved model then answers
`aiayn translate` for any word.

Re-running reuses what is done: a finished model is evaluated again; an interrupted training run
(killed, or out of time) resumes from its last checkpoint.

aiayn/presets.py imports this module for its preset, so the pipeline's own steps (torch, the data
pipeline, the trainer, the decoder) are imported inside the functions that run them: looking up a
preset (`aiayn info --list`) does not pay for them.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from aiayn.checks import read_json
from aiayn.config import BASE, Config
from aiayn.evaluation.g2p import phoneme_error_rate, word_error_rate
from aiayn.files import atomic_write
from aiayn.recipes.cmudict_data import read_refs, write_g2p_corpus

# The demo's model (size "small"): the base model at 3+3 layers of width 128 (in the demo's minutes
# more epochs pay more than width 256), pre-norm blocks and no residual dropout (the model
# underfits CMUdict's ~117K words in that time, and dropout's masks cost time each step), a
# warmup fit for a run of a few thousand updates and the rate falling linearly to 0 over the run's
# last 20%. A pronunciation is rarely more than a few symbols longer than its spelling, so outputs
# stop at +10, not +50. Chosen on the validation words; the runs, their machines and scores:
# docs/experiments/g2p.md.
G2P_SMALL_V2 = replace(BASE, n_layers=3, d_model=128, d_ff=512, n_heads=4, norm="pre", p_drop=0.0,
                       warmup_steps=400, max_tokens=4000, max_len_b=10, lr_cooldown=0.2)

# Not the paper's model: the RNN encoder-decoder baseline (Bahdanau et al. 2015, `arch="rnn"`,
# aiayn.model.rnn) for the demo's data, to compare against at the same budget (Table 1's question
# on this task; docs/experiments/rnn-vs-transformer.md). Its rate and warmup are those of the
# translation recipe's RNN (a 3.1e-3 peak after 200 updates: Eq. 3 scales by d_model^-0.5, and
# d_model, 512 here, is otherwise unused), its update size, output limit and cooldown the demo's,
# and the paper's P_drop 0.1; embeddings of 128 like the Transformer's, 256 GRU units.
G2P_SMALL_RNN = replace(BASE, arch="rnn", rnn_emb=128, rnn_hidden=256, rnn_attn=256, p_drop=0.1,
                        warmup_steps=200, max_tokens=4000, max_len_b=10, lr_cooldown=0.2)

# One preset per size; the names they replaced are in aiayn/presets.py's RETIRED.
PRESETS = {"g2p-small-v2": G2P_SMALL_V2, "g2p-small-rnn": G2P_SMALL_RNN}

# Words not in CMUdict, to show the model generalising.
NOVEL_WORDS = ["vaswani", "sentencepiece", "pytorch", "tokenizer", "aiayn"]


def _final_model(run_dir: Path, model_dir: Path) -> list[str]:
    """Average the run's newest checkpoints, up to the config's n_average (§6.1), into a plain
    model directory (weights, config, tokenizers; no trainer state). Returns their names."""
    from aiayn.data.model_dir import read_config
    from aiayn.training.average import average_checkpoints
    from aiayn.training.checkpoint import list_checkpoints

    ckpts = [d for _, d in list_checkpoints(run_dir)]
    chosen = ckpts[-read_config(ckpts[-1]).n_average:]
    average_checkpoints(chosen, model_dir, overwrite=True)
    return [p.name for p in chosen]


def evaluate_g2p(model_dir: str | Path, words: list[str], refs: list[list[str]],
                 beam_size: int | None = None, progress: bool = True,
                 device: str | None = None, alpha: float | None = None) -> dict:
    """Beam-search each word (in fp32, so results compare across machines); WER (no reference
    pronunciation matched) and PER. `device` None: the CPU; `beam_size`, `alpha` None: the
    model's config."""
    from aiayn.data.model_dir import load_model
    from aiayn.decoding.translate import Translator

    tr = Translator(load_model(model_dir, device or "cpu"), precision="fp32", beam_size=beam_size,
                    alpha=alpha)
    t0 = time.perf_counter()
    hyps = tr.translate(words, progress=progress)
    seconds = time.perf_counter() - t0
    return {"wer": word_error_rate(hyps, refs), "per": phoneme_error_rate(hyps, refs),
            "words": len(words), "decode_seconds": seconds, "hyps": hyps,
            "novel": dict(zip(NOVEL_WORDS, tr.translate(NOVEL_WORDS)))}


def run_g2p(out_dir: str | Path, cfg: Config = G2P_SMALL_V2, preset: str = "g2p-small-v2",
            overrides: list[str] | None = None, minutes: float = 7.5, seed: int = 1,
            threads: int | None = None, precision: str = "auto", device: str | None = None,
            retrain: bool = False, keep: int | None = None,
            max_train_words: int | None = None, n_valid: int = 2000, n_test: int = 6000,
            progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """The whole demo, training `cfg` (named `preset` with `overrides` in the logs and results)
    on `device` (None: the GPU when there is one), keeping the `keep` newest checkpoints (None:
    n_average); returns the results (also written to OUT/results.json)."""
    from aiayn.data.corpus import ParallelSource
    from aiayn.data.prepare import PrepareOptions, format_summary, prepare_dataset
    from aiayn.training.trainer import TrainOptions, train

    t_start = time.perf_counter()
    out = Path(out_dir)
    corpus, data, run, model = out / "corpus", out / "data", out / "run", out / "model"
    # The split is the fixed SPLIT_SEED's: `seed` is training's (weights, dropout, batch order).
    counts = write_g2p_corpus(corpus, n_valid=n_valid, n_test=n_test,
                              max_train_words=max_train_words)
    log(f"CMUdict: {counts['words']:,} words; train {counts['train']['words']:,} words "
        f"({counts['train']['pairs']:,} pronunciations), valid {n_valid:,}, test {n_test:,} "
        "(split by word, stress removed)")
    splits = {name: ParallelSource(corpus / f"{name}.src", corpus / f"{name}.tgt")
              for name in ("train", "valid", "test")}
    # Characters in, phoneme symbols out: one target piece per phoneme (+4 specials).
    options = PrepareOptions(src_lang="spelling", tgt_lang="phonemes", separate_vocab=True,
                             model_type="char", tgt_model_type="word",
                             vocab_size=int(counts["phonemes"]) + 4, max_len=0, max_ratio=0)
    prepared = prepare_dataset(data, splits, options, overwrite=True)
    log(format_summary(prepared))

    if retrain or not (model / "config.json").exists():
        resume = (run / "last").exists() and not retrain
        log(f"{'resuming' if resume else 'training'} preset {preset} for up to {minutes:g} minutes")
        # A checkpoint every 1/30 of the budget, so the n_average (5) averaged at the end span its
        # last sixth. Measured on the validation words of the 30-minute run (docs/experiments/g2p.md): averaging
        # the last 4 minutes beat the last checkpoint by 1.2 points of WER, the last 8 by 0.35.
        summary = train(None if resume else cfg, data, run, TrainOptions(
            time_budget=minutes, eval_every=500, eval_bleu_sentences=0, seed=seed,
            threads=threads, precision=precision, device=device, resume=resume, overwrite=retrain,
            progress=progress,
            save_minutes=max(minutes / 30, 0.1), keep=keep, tensorboard=True))
        averaged = _final_model(run, model)
        log(f"final model: the average of {len(averaged)} checkpoints ({', '.join(averaged)})")
    else:
        summary = read_json(run / "summary.json", dict) if (run / "summary.json").exists() else {}
        # The model may predate a change of the default preset: report what it was trained with.
        before = (read_json(out / "results.json", {"?preset": str, "?overrides": [str]})
                  if (out / "results.json").exists() else {})
        preset, overrides = before.get("preset", f"{preset}?"), before.get("overrides", overrides)
        log(f"reusing the trained model in {model} (preset {preset}; pass --retrain to train again)")

    # Valid is for choosing settings (docs/experiments/g2p.md); test is reported.
    valid = evaluate_g2p(model, (corpus / "valid.src").read_text(encoding="utf-8").splitlines(),
                         read_refs(corpus / "valid.refs"), progress=progress, device=device)
    test_words = (corpus / "test.src").read_text(encoding="utf-8").splitlines()
    refs = read_refs(corpus / "test.refs")
    res = evaluate_g2p(model, test_words, refs, progress=progress, device=device)
    results = {
        "wer": res["wer"], "per": res["per"], "test_words": res["words"],
        "valid_wer": valid["wer"], "valid_per": valid["per"],
        "decode_seconds": res["decode_seconds"], "total_seconds": time.perf_counter() - t_start,
        "train": {k: summary.get(k) for k in ("steps", "epochs", "train_seconds", "tgt_tokens",
                                              "tgt_tokens_per_s", "final_dev", "precision")},
        "preset": preset, "overrides": overrides or [], "model": str(model),
        "samples": [{"word": w, "predicted": h, "dictionary": r}
                    for w, h, r in list(zip(test_words, res["hyps"], refs))[:10]],
        "novel_words": res["novel"],
    }
    with atomic_write(out / "results.json") as f:
        json.dump(results, f, indent=2)
    return results


def format_results(r: dict) -> str:
    lines = [f"{'word':<16} {'predicted':<28} dictionary"]
    for s in r["samples"]:
        mark = "ok " if s["predicted"] in s["dictionary"] else "   "
        lines.append(f"{s['word']:<16} {s['predicted']:<28} {mark}{' | '.join(s['dictionary'])}")
    lines.append("")
    lines.append("words not in the dictionary: " +
                 ", ".join(f"{w} -> {p}" for w, p in r["novel_words"].items()))
    lines.append("")
    lines.append(f"validation words: word error rate {100 * r['valid_wer']:.1f}%, "
                 f"phoneme error rate {100 * r['valid_per']:.1f}%")
    lines.append(f"held-out words: {r['test_words']:,}   word error rate {100 * r['wer']:.1f}%   "
                 f"phoneme error rate {100 * r['per']:.1f}%   (beam search, "
                 f"{r['decode_seconds']:.0f}s; total {r['total_seconds'] / 60:.1f} min)")
    lines.append(f"try it: echo hello | aiayn translate --model {r['model']}")
    return "\n".join(lines)
