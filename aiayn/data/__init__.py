"""Data pipeline: raw parallel corpora -> shared subword vocabulary -> binarized dataset -> batches.

- `corpus`    reads parallel text (line-aligned file pairs, optionally gzipped; TSV; WMT SGML),
              whole or streamed in chunks, and the training-pair filters (too long, extreme
              length ratio).
- `tokenizer` the sentencepiece BPE vocabulary shared by source and target (§5.1) and the
              project-wide special ids PAD_ID=0, UNK_ID=1, BOS_ID=2, EOS_ID=3.
- `prepare`   `aiayn prepare`'s work: learn the vocabulary, binarize every split into a dataset
              directory (token ids, offsets, raw dev/test lines, manifest), at any corpus size in
              bounded memory, resumably.
- `encode`    the vocabulary sample and chunked encoding over worker processes, for `prepare`.
- `shards`    writing a dataset's shards, and the work directory an interrupted `prepare` resumes.
- `dataset`   that directory's layout, and `ParallelDataset` to read a split back memory-mapped.
- `batching`  batches of about `max_tokens` source and target tokens grouped by length (§5.1),
              shuffled, resumable and sharded across ranks; `collate` pads them into tensors.

Import from the submodules; this package's `__init__` imports nothing itself.
"""
