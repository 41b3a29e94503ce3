"""The wavefront's kernel one layer at a time (not yet in the chapter: measured on no GPU so far, see
EXPERIMENTS.md). make_wavefront_kernel built for L = 1 keeps no W_ih on chip and stages no input
rows: each layer's input term is step 2's hoisted GEMM, as in the fused and persistent LSTMs. A
block then holds only W_hh (an eighth of a wavefront block's weights: 128 blocks a layer), so a
lane's shared-memory reads per batch row are about half the wavefront's; the price is T barriers a
layer, T * L in all, against the wavefront's T + L - 1."""

import numpy as np

from workbook import cuda
from workbook.inputs import sm_count
from workbook.launch import shared_memory_limit

from .fused import FusedLSTM
from .persistent import cooperative_launch
from .wavefront import block_shape, chunk_rows, make_wavefront_kernel, shared_words


class LayerwiseLSTM(FusedLSTM):
    """Step 2's input GEMM, then the wavefront's kernel for one layer, a cooperative launch a layer."""

    def __init__(self, weights, blocks=None):
        super().__init__(weights)
        H = self.hidden
        self.w_hh_flat = [cuda.to_device(w["w_hh"].reshape(-1)) for w in weights]
        self.counter = cuda.to_device(np.zeros(2, np.uint64))
        resident = sm_count() if blocks is None else blocks
        self.units = -(-H // resident)
        self.blocks = -(-H // self.units)
        rows_per_warp, self.threads = block_shape(H, self.units)
        limit = shared_memory_limit()
        if rows_per_warp > 32 or 4 * shared_words(H, self.units, 1, inputs=False) > limit:
            raise ValueError(f"hidden size {H} over {self.blocks} blocks gives each block {self.units} units: "
                             f"{rows_per_warp} weight rows a warp (at most 32) or more than the {limit} bytes of "
                             "shared memory: use more blocks")

    def _layer(self, layer, x, h, c, y, stream):
        T, B, _ = x.shape
        H = self.hidden
        chunk = chunk_rows(H, self.units, B, inputs=False)
        x_terms = self.input_terms(layer, x, stream)
        w_hh = self.w_hh_flat[layer]
        cooperative_launch(make_wavefront_kernel(H, self.units, 1, chunk), self.blocks, self.threads,
               4 * shared_words(H, self.units, chunk, inputs=False), stream,
               x_terms.reshape(-1), w_hh, w_hh, self.bias[layer], h.reshape(-1), c.reshape(-1), y.reshape(-1),
               np.int64(T), np.int64(B), self.counter)  # w_hh in W_ih's place: one layer reads no W_ih
