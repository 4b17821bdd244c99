"""End-to-end recipes built from the library, each module with its presets beside it:
`g2p` (CMUdict grapheme-to-phoneme, the demo), `multi30k` (translation of a small corpus:
Multi30k; the pipeline itself is scripts/multi30k.sh), `parsing` (constituency parsing on a Penn
Treebank, §6.3; scripts/parsing.sh), `table3` (the paper's Table 3 variations at CPU scale, run
by `table3_study` and reported by `table3_report`). `download` fetches public data sets with
checksums, resumably; `wmt14` is where the paper's WMT 2014 data is and how it unpacks (its recipe
is scripts/wmt14.sh, its presets the paper's own, in aiayn/config.py).

A recipe's presets are a `PRESETS` dict in its module, each a small delta of a paper preset;
aiayn/presets.py gathers them, with the names that were retired.
"""
