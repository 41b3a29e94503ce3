"""Chapter 00, part 3: bytes in flight (Little's law), the figure that decides whether a kernel
reaches the copy ceiling on a given GPU.

    bandwidth = bytes in flight / latency        so        bytes in flight needed = ceiling x latency

Two kernels measure the two sides of it:

    chase_kernel        one thread follows a chain of dependent loads through a buffer past the L2:
                        each load waits for the one before, so the time per step is the latency
    in_flight_copy      a grid-stride copy of 16-byte quads with exactly `blocks_per_sm` blocks of
                        256 threads on every SM; each thread has one quad load outstanding at a
                        time, so an SM keeps blocks_per_sm x 256 x 16 bytes in flight

A GPU with more bandwidth and the same latency needs more bytes in flight per SM to reach its
ceiling: the same kernel can be fast on one GPU and fall short on the next.
"""

import numpy as np
from numba import cuda

from workbook.inputs import require, sm_count
from workbook.memory import aligned, load4, store4

THREADS_PER_BLOCK = 256
QUAD_BYTES = 16


@cuda.jit
def chase_kernel(chain, steps, out):
    """One thread: j = chain[j], `steps` times from 0; out[0] = where it ended (so that no load is
    dead code). Each load's address is the value of the last: nothing overlaps."""
    if cuda.grid(1) == 0:
        j = 0
        for _ in range(steps):
            j = chain[j]
        out[0] = j


@cuda.jit
def in_flight_copy_kernel(src, dst):
    """dst = src as uint32 quads, grid-stride: one quad load in flight per thread; the last
    size % 4 words by the first threads of the grid."""
    quads = src.size // 4
    step = cuda.gridsize(1)
    q = cuda.grid(1)
    while q < quads:
        store4(dst, 4 * q, load4(src, 4 * q))
        q += step
    i = 4 * quads + cuda.grid(1)
    if i < src.size:
        dst[i] = src[i]


def chain(n, stride):
    """int32[n]: chain[i] = (i + stride) % n, a cycle through the buffer in strides of `stride`
    elements (pick one far past a DRAM page and coprime with n, so that no step is cached)."""
    if not 0 < stride < n:
        raise ValueError(f"stride must be between 1 and n - 1 = {n - 1}, got {stride}")
    return ((np.arange(n, dtype=np.int64) + stride) % n).astype(np.int32)


def chase_reference(n, stride, steps):
    return np.array([(steps * stride) % n], dtype=np.int32)


def chase(chain_device, steps, out):
    """Launch the chase: one block of one thread."""
    chain_device = require(chain_device, "chain", dtype=np.int32, ndim=1)
    out = require(out, "out", dtype=np.int32, shape=(1,))
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    chase_kernel[1, 1](chain_device, steps, out)
    return out


def in_flight_copy(src, dst, blocks_per_sm):
    """Copy float32 src into dst with blocks_per_sm blocks of 256 threads on each SM."""
    src = require(src, "src", dtype=np.float32, ndim=1)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    if not 1 <= blocks_per_sm <= 8:
        raise ValueError(f"blocks_per_sm must be 1..8 (2048 threads an SM at most), got {blocks_per_sm}")
    if not (aligned(src, QUAD_BYTES) and aligned(dst, QUAD_BYTES)):
        raise ValueError("src and dst must start on a 16-byte boundary (quads)")
    in_flight_copy_kernel[sm_count() * blocks_per_sm, THREADS_PER_BLOCK](src.view(np.uint32), dst.view(np.uint32))
    return dst


def bytes_in_flight_per_sm(blocks_per_sm):
    """What one SM keeps outstanding in in_flight_copy: a quad load per thread."""
    return blocks_per_sm * THREADS_PER_BLOCK * QUAD_BYTES


def needed_per_sm(ceiling_gbps, latency_ns, sms):
    """Little's law: the bytes an SM must keep in flight for the whole GPU to move ceiling_gbps."""
    return ceiling_gbps * latency_ns / sms  # GB/s x ns = bytes
