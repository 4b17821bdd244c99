"""Multi30k translation (29,000 caption pairs, ~13 words a sentence) in an hour on 2 CPU cores:
the presets of scripts/multi30k.sh (prepare -> train -> average -> translate -> evaluate).

Each was chosen on the val split; the runs behind them are in docs/experiments/multi30k.md.
"""

from __future__ import annotations

from dataclasses import replace

from aiayn.config import BASE

# The base model scaled to the data and the hour: 3+3 layers of width 256 (7.6M parameters with an
# 8,000-piece shared BPE), more residual dropout for the small corpus, a warmup fit for a run of a
# few thousand updates, ~4,096 tokens per side per update.
MULTI30K = replace(BASE, n_layers=3, d_model=256, d_ff=1024, n_heads=4, p_drop=0.3, warmup_steps=1000,
                   max_tokens=4096)

PRESETS = {
    "multi30k": MULTI30K,
    # What scripts/multi30k.sh runs: dropout 0.1 on the attention weights and the FFN's ReLU output
    # (`multi30k`'s dev loss stalled after ~3,500 updates), length penalty alpha 1.5 (at 0.6 the val
    # outputs were 7% short), and the rate falling linearly to 0 over the run's last 20%.
    "multi30k-v3": replace(MULTI30K, p_attn_drop=0.1, p_ffn_drop=0.1, alpha=1.5, lr_cooldown=0.2),
}
