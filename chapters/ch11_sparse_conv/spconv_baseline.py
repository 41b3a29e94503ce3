"""spconv 2.x on the chapter's layer, where it is installed: the library these notes come from, as a
baseline in the same run, on the same device buffers (torch views of them).

spconv is not a dependency of the workbook. `tools/spconv_bundle.sh` packs it for a GPU machine
without network; on a laptop `load()` says why it is not there and the chapter goes on without it.

The layer is spconv's `SubMConv3d` (3x3x3, no bias) in inference mode: spconv 2.x's own implicit
GEMM over its pair table with masks (ConvAlgo.MaskImplicitGemm, its default), float32 without TF32
(its default too), or FP16 on tensor cores when the features and weights are FP16. Its maps are
built once, by the first call, and reused by every later one, as a network's layers would."""

import numpy as np

KERNEL = 3


def load():
    """(spconv.pytorch, None), or (None, why it cannot run here)."""
    try:
        import spconv.pytorch as spconv
    except ImportError as why:
        return None, f"not installed ({why})"
    import torch
    if not torch.cuda.is_available():
        return None, "no GPU for torch"
    return spconv, None


def spconv_weights(w):
    """w (27, C, K), taps in reference.OFFSETS order (dx outermost) -> spconv's (K, 3, 3, 3, C):
    its weight [:, a, b, c, :] multiplies the input at output + (a - 1, b - 1, c - 1), as ours does
    at output + OFFSETS[k]."""
    taps, C, K = w.shape
    return np.ascontiguousarray(np.asarray(w).reshape(KERNEL, KERNEL, KERNEL, C, K).transpose(4, 0, 1, 2, 3))


class SpconvLayer:
    """spconv's submanifold 3x3x3 convolution of the sites `coords` (N, 3), weights w (27, C, K)."""

    def __init__(self, spconv, coords, w, dtype=None):
        import torch
        self.spconv, self.torch = spconv, torch
        coords = torch.as_tensor(np.asarray(coords, np.int32), device="cuda")
        self.indices = torch.cat([torch.zeros_like(coords[:, :1]), coords], dim=1).contiguous()  # batch 0
        self.shape = [int(v) + 1 for v in coords.max(dim=0).values.tolist()]
        C, K = w.shape[1], w.shape[2]
        self.conv = spconv.SubMConv3d(C, K, KERNEL, bias=False, indice_key="layer",
                                      fp32_accum=True).cuda().eval()  # FP16: sums in float32, as ours
        with torch.no_grad():
            self.conv.weight.copy_(torch.as_tensor(spconv_weights(w)))
        if dtype is not None:
            self.conv = self.conv.to(dtype)
        self.input = None

    def __call__(self, features):
        """out (N, K): features (N, C), a torch tensor on the GPU of the layer's dtype. The first call
        builds the maps (and lets spconv pick its kernel); the later ones reuse them."""
        with self.torch.no_grad():
            if self.input is None:
                first = self.spconv.SparseConvTensor(features, self.indices, self.shape, 1)
                out = self.conv(first)
                self.input = first
                self.input.indice_dict = out.indice_dict  # the maps, kept for the next calls
                return out.features
            return self.conv(self.input.replace_feature(features)).features

    def build_maps(self):
        """spconv's maps for this active set, from scratch: its hash table, pair table and the rows'
        masks sorted (what its first call builds). Returns the pair table."""
        from spconv.core import ConvAlgo
        from spconv.pytorch import ops
        conv = self.conv
        return ops.get_indice_pairs_implicit_gemm(
            self.indices, 1, self.shape, ConvAlgo.MaskImplicitGemm, ksize=list(conv.kernel_size),
            stride=list(conv.stride), padding=list(conv.padding), dilation=list(conv.dilation),
            out_padding=list(conv.output_padding), subm=True, transpose=False, is_train=False)[2]
