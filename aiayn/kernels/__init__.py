"""The fast paths aiayn computes the paper's mathematics with, beside the definitions they stand
for: when attention is Eq. 1 written out and when PyTorch's fused kernel (`attention`), the
dropout mask (`dropout`) and the label-smoothed loss with its hand-written gradient (`loss`).

Below the model in the package's layering: these modules import only torch and aiayn's base
modules, and the model, the trainer and evaluation call them. The definitions are in
aiayn/model/attention.py (Eq. 1) and aiayn/training/loss.py (§5.4); the tests compare each fast
path with its definition, and what each path buys is measured in docs/experiments/performance.md
and docs/experiments/decoding.md.
"""
