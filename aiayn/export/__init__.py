"""A model directory handed to other runtimes (`aiayn export --format ...`), one module each:

- `huggingface` Hugging Face Transformers' `MarianMTModel` (weights permuted, loaded as they are);
- `onnx`        an encoder and an incremental decoder as ONNX graphs, and `OnnxGreedy` to run them;
- `ctranslate2` CTranslate2's model spec, for its int8 and float32 CPU decoding.

Each imports its optional package where it is used: without it the module still imports and the
command says what to install.
"""
