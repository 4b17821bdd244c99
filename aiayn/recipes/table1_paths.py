"""Table 1's last two columns computed from each layer kind's connectivity: sequential operations
per layer and the maximum path length between any input and any output position of a stack.

A layer kind is described by which positions of the layer below output position i reads
(`Connectivity`). Path lengths are counted in edges of the network's graph: one edge per layer
crossed, plus one per recurrent step along a layer (h_{i-1} -> h_i). The stack is made as deep as
it needs to be: layers are added until no pair (input j, position i) gets a shorter path, and the
shortest path of each pair is its minimum over every depth. The maximum over the connected pairs
is Table 1's "maximum path length" (self-attention O(1), recurrent O(n), contiguous convolution
O(n/k), dilated convolution O(log_k n), restricted self-attention O(n/r)); the depth it took is
the number of layers a stack needs to connect every pair it can connect.

Distances are propagated for every source at once as an (n, n) array, one layer at a time
(min-plus product with the layer's sparse connectivity), so n up to about a thousand takes seconds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Connectivity:
    """Output position i of a layer reads positions i + o (o in `offsets`, inside the sequence) of
    the layer below, or all of them when `offsets` is None; `recurrent`: also the same layer's
    output i - 1 (a unidirectional RNN); `dilation_base`: layer l (from 1) multiplies its offsets
    by dilation_base ** (l - 1), the dilations cycling back to 1 once they reach the sequence
    length (dilated convolutions, as in WaveNet and ByteNet)."""

    offsets: tuple[int, ...] | None
    recurrent: bool = False
    dilation_base: int = 1


def self_attention() -> Connectivity:
    return Connectivity(None)


def restricted(r: int) -> Connectivity:
    return Connectivity(tuple(range(-r, r + 1)))


def recurrent() -> Connectivity:
    return Connectivity((0,), recurrent=True)


def convolution(k: int, dilated: bool = False) -> Connectivity:
    half = (k - 1) // 2  # a centred kernel of width k ("same" padding)
    return Connectivity(tuple(range(-half, k - half)), dilation_base=k if dilated else 1)


def layer_step(dist: np.ndarray, conn: Connectivity, layer: int) -> np.ndarray:
    """Shortest path lengths to the outputs of `layer` (from 1), from those to its inputs.
    dist: (n_sources, n) float, inf where unreachable."""
    n = dist.shape[1]
    if conn.offsets is None:  # every output reads every input
        new = np.repeat(dist.min(axis=1, keepdims=True) + 1, n, axis=1)
    else:
        new = np.full_like(dist, np.inf)
        scale = 1
        if conn.dilation_base > 1:
            cycle = 1 + int(np.floor(np.log(max(n - 1, 1)) / np.log(conn.dilation_base) + 1e-9))
            scale = conn.dilation_base ** ((layer - 1) % cycle)  # the dilations that are < n
        for o in conn.offsets:
            o *= scale
            lo, hi = max(0, -o), min(n, n - o)  # outputs i whose input i + o exists
            if lo < hi:
                np.minimum(new[:, lo:hi], dist[:, lo + o:hi + o] + 1, out=new[:, lo:hi])
    if conn.recurrent:  # new[i] = min(new[i], new[i-1] + 1), a running minimum along the layer
        idx = np.arange(n, dtype=dist.dtype)
        new = np.minimum.accumulate(new - idx, axis=1) + idx
    return new


@dataclass
class PathStats:
    max_path: float  # the longest shortest path over connected (input, position) pairs
    layers: int  # layers the stack needed until no pair's path got shorter
    connected: float  # fraction of (input, position) pairs that any depth connects


def shortest_paths(conn: Connectivity, n: int, max_layers: int | None = None
                   ) -> tuple[np.ndarray, int]:
    """Shortest path lengths (n, n) from every input position j (row) to every position i's
    representation (column) at any depth of a stack of up to `max_layers` layers (default: as
    many as it takes; inf where unconnected), and the depth after which no path got shorter."""
    dist = np.where(np.eye(n, dtype=bool), 0.0, np.inf).astype(np.float32)  # the inputs themselves
    best = np.full((n, n), np.inf, dtype=np.float32)
    layer = last_gain = 0
    while max_layers is None or layer < max_layers:
        layer += 1
        dist = layer_step(dist, conn, layer)
        gain = dist < best
        if not gain.any():
            break
        best = np.minimum(best, dist)
        last_gain = layer
    return best, last_gain


def path_lengths(conn: Connectivity, n: int, max_layers: int | None = None) -> PathStats:
    """The longest shortest path over connected pairs (`shortest_paths`), with its depth."""
    best, last_gain = shortest_paths(conn, n, max_layers)
    finite = np.isfinite(best)
    return PathStats(float(best[finite].max()), last_gain, float(finite.mean()))


def sequential_operations(conn: Connectivity, n: int) -> int:
    """The longest chain of operations inside one layer that must run one after another: the
    longest path in the layer's own dependency graph (output i waits for output i - 1 in a
    recurrent layer; otherwise every output depends only on the layer below)."""
    depth = np.ones(n, dtype=np.int64)
    if conn.recurrent:
        for i in range(1, n):
            depth[i] = depth[i - 1] + 1
    return int(depth.max())
