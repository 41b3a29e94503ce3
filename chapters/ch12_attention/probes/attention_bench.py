"""The fused attention kernels (mma.sync at other tile sizes; wgmma) beside torch's attention, on a GPU.

    python chapters/ch12_attention/probes/attention_bench.py [d] [keys ...]

For each causal flag and each N in 4096 (64 heads) and 16384 (16 heads): TFLOP/s (4·heads·N²·d,
half under the causal mask) of the fused kernel with `keys` keys a tile (64 and 32 by default),
of the wgmma kernel (hopper.py; d = 128 on an H100/H200), of torch SDPA's default backend and of its
FlashAttention-2 backend; CUDA events, 10 interleaved repeats after a warm-up
(bench.time_interleaved), median and range; each kernel's registers and local (spilled) bytes a
thread, and its largest difference from SDPA's output. What EXPERIMENTS.md records came from this
script.
"""

import math
import sys

import numpy as np

import workbook  # noqa: F401  (first: the GPU or the simulator)
from numba import cuda, typeof
from workbook.bench import time_interleaved

from chapters.ch12_attention import fused, hopper
from workbook import capability
from workbook.launch import allow_shared_memory
from workbook.tensor_cores import wgmma_compile


def main(d=128, keys=(64, 32)):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    for causal in (False, True):
        for heads, n in ((64, 4096), (16, 16384)):
            generator = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(1, heads, n, d, device="cuda", dtype=torch.float16, generator=generator)
                       for _ in range(3))
            flops = 4 * heads * n * n * d / (2 if causal else 1)

            def flash():
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    return sdpa(q, k, v, is_causal=causal)

            runs = {"torch SDPA default": lambda: sdpa(q, k, v, is_causal=causal),
                    "torch SDPA FlashAttention-2": flash}
            out = torch.empty_like(q)
            arrays = [cuda.as_cuda_array(x[0]) for x in (q, k, v, out)]
            scale = np.float32(math.log2(math.e) / math.sqrt(d))
            for tile in keys:
                kernel = fused.make_forward(d, causal, tile)
                compiled = kernel.compile(tuple(typeof(a) for a in (*arrays, scale)))
                allow_shared_memory(compiled, fused.shared_bytes(d, tile))
                launch = kernel[(-(-n // fused.BM), heads), fused.THREADS, 0, fused.shared_bytes(d, tile)]
                name = f"fused, {tile} keys a tile ({compiled.regs_per_thread} registers, " \
                       f"{compiled.local_mem_per_thread} B local)"
                runs[name] = lambda launch=launch: launch(*arrays, scale)
            if d == hopper.D and capability.supports("wgmma"):
                kernel = hopper.make_forward(causal)
                compiled = wgmma_compile(kernel, tuple(typeof(a) for a in (*arrays, scale)), hopper.shared_bytes())
                launch = kernel[(-(-n // hopper.BM), heads), hopper.THREADS, 0, hopper.shared_bytes()]
                name = f"wgmma ({compiled.regs_per_thread} registers, {compiled.local_mem_per_thread} B local)"
                runs[name] = lambda launch=launch: launch(*arrays, scale)
            expected = sdpa(q, k, v, is_causal=causal).float()
            for name, run in runs.items():
                if not name.startswith("torch"):
                    run()
                    error = (out.float() - expected).abs().max().item()
                    print(f"  {name}: largest difference from SDPA {error:.2e}")
            for run in runs.values():  # a warm-up each
                run()
            print(f"d={d} causal={causal} {heads} heads x {n}")
            for name, ms in time_interleaved(runs, repeats=10).items():
                rates = flops / ms / 1e9
                print(f"  {name:58s} {np.median(rates):6.1f} TFLOP/s ({rates.min():.1f}-{rates.max():.1f})")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 128, tuple(map(int, sys.argv[2:])) or (64, 32))
