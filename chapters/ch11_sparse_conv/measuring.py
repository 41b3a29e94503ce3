"""What chapter 11's notebook checks and measures with, so that the notebook shows the maps and
kernels and their figures rather than the plumbing:

    check_tiny           both variants against the dense definition on one tiny voxel set
    torch_rulebook_conv  torch's gather-GEMM-scatter (index_select, mm, index_add_) on our rulebook
    traffic              what one call of a layer moves through memory, as the simulator traces it
"""

import numpy as np

from workbook import bench, cuda, memtrace
from workbook.check import assert_close

from . import implicit, maps, naive
from . import reference as ref


def check_tiny(name, sites, w, out_channels, tolerance):
    """Gather-GEMM-scatter and the implicit GEMM against the dense definition on `sites`."""
    sites = np.asarray(sites, np.int32)
    channels = w.shape[1]
    xs = ref.features(len(sites), channels, seed=2)
    want = ref.submanifold_dense(sites, xs, w)
    pairs = maps.SiteTable(cuda.to_device(sites)).pairs()
    for variant, layer in (("gather-GEMM-scatter", naive.GatherGemmScatter(maps.rulebook(pairs), channels,
                                                                             out_channels)),
                           ("implicit GEMM", implicit.ImplicitGemm(pairs))):
        got = layer(cuda.to_device(xs), cuda.to_device(w), cuda.device_array((len(sites), out_channels), np.float32))
        assert_close(got, want.astype(np.float32), rtol=tolerance[0], atol=tolerance[1], name=f"{variant}, {name}")


def torch_rulebook_conv(torch, rules, d_x, d_w, out_channels, half=False):
    """The convolution written with torch on our rulebook: for each tap, the rows it pairs gathered
    (index_select), multiplied (mm) and added into the output (index_add_); half: FP16 operands and
    products, summed in float32. A function of no arguments returning the output tensor."""
    t_x, t_w = bench.torch_view(d_x), bench.torch_view(d_w)
    if half:
        t_x, t_w = t_x.half(), t_w.half()
    t_out = torch.zeros((d_x.shape[0], out_channels), device="cuda")
    taps = [(k, bench.torch_view(rules.rule_in[k]).long()[:c], bench.torch_view(rules.rule_out[k]).long()[:c])
            for k, c in enumerate(rules.counts) if c]

    def run():
        t_out.zero_()
        for k, rule_in, rule_out in taps:
            t_out.index_add_(0, rule_out, (t_x.index_select(0, rule_in) @ t_w[k]).float())
        return t_out
    return run


def traffic(layer, d_x, d_w, out):
    """Bytes one call of the layer moves through global memory, loads and stores (32-byte sectors),
    and its shared-memory passes."""
    with memtrace.trace() as recorded:
        layer(d_x, d_w, out)
    spaces = [(what, totals) for launched in recorded.kernels().values() for what, totals in launched.items()]
    return {"loads": sum(t.moved for what, t in spaces if what == "global ld"),
            "stores": sum(t.moved for what, t in spaces if what == "global st"),
            "shared passes": sum(t.passes for what, t in spaces if what.startswith("shared"))}
