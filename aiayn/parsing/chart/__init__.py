"""A span-based chart parser over the Transformer's encoder (not in the paper; an option beside
§6.3's sequence-to-sequence parser).

§6.3 writes a tree as a sequence and lets the decoder learn to write well-formed ones. This
parser keeps the paper's encoder (§3.1, the same `EncoderLayer`s) and drops the decoder: every
span of the sentence gets a score per label, and CKY picks the best-scoring tree, so every output
is a well-formed tree over exactly the input's words by construction. This is the design of Stern
et al. (2017, "A Minimal Span-Based Neural Constituency Parser") on the self-attentive encoder of
Kitaev & Klein (2018, "Constituency Parsing with a Self-Attentive Encoder"); it learns from fewer
trees than the sequence-to-sequence parser, which is what the 10% WSJ sample has
(docs/guides/parsing.md). Each word reaches the encoder as its embedding plus what a character
CNN reads in its spelling, so rare and unknown words are more than their signature.

The modules, in the order a sentence meets them:
- `config`: `ChartConfig`, the sizes and the training recipe (preset `parsing-chart-small`);
- `data`: a corpus of `aiayn treebank`, the vocabularies, batches of similar lengths;
- `model`: `SpanParser` (encoder, character CNN, span scorer) and its loss;
- `trees`: spans of trees and back, CKY, votes of other parsers;
- `task`: what `aiayn train` needs to train it (aiayn/training/task.py);
- `files`: its model directory, written and read;
- `parse`: sentences to trees, with one model or an ensemble (`aiayn parse`).

Training goes through the project's one trainer: `aiayn train --preset parsing-chart-small
--data CORPUS --out RUN`, then `aiayn average --run RUN --out MODEL`.
"""
