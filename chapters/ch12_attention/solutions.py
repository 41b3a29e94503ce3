"""Chapter 12 — exercises: attention's online softmax, a warp a query.

Each exercise is the code between `# >>> ch12.N` and `# <<< ch12.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch12` (or run the exercise cells of the chapter's
notebook). The reference is the chapter's float64 NumPy function (reference.py).

The kernel of all four is the fused kernel's algorithm without the tensor cores, small enough to
read in one go: q, k, v, o are (heads, N, 32) float32 arrays. A block of 4 warps owns 4 queries, a
warp each; the block streams K and V through shared memory in tiles of 32 keys, two stages: while
the warps work on tile j, tile j + 1 is loaded into the other stage. For each tile, lane L of a
warp scores key 32j + L against the warp's query; the warp's running maximum m and sum l, and the
number of the output row each lane keeps (column L), are updated online.

All four regions are in that one kernel, and every check runs it whole: it stops at the first stub
it meets. Complete ch12.1, then ch12.2 (the kernel meets them in that order); the checks of
ch12.3 and ch12.4 then show their planted bugs.
"""

import math

import numpy as np
from numba import cuda, float32

from workbook.inputs import require

WARP = 32
ROWS = 4  # queries a block, a warp each
KEYS = 32  # keys a tile: a lane's score each
D = 32  # the head dimension: an output column a lane
ROW = D + 1  # a key's row in shared memory, one float longer: lane L reads row L, on bank L
STAGE = 2 * KEYS * ROW  # a stage: K's tile, then V's
STAGES = 2 * STAGE  # numba sizes shared arrays from constants only
FULL = 0xFFFFFFFF
NEG_INF = float32(-math.inf)


@cuda.jit(device=True)
def load_tile(k, v, tiles, stage, head, j, n):
    """K and V's tile j into `stage` (0 or 1), every thread of the block its share; keys past N are 0."""
    base = stage * STAGE
    for e in range(cuda.threadIdx.x, KEYS * D, ROWS * WARP):
        key, c = e // D, e % D
        inside = j * KEYS + key < n
        tiles[base + key * ROW + c] = k[head, j * KEYS + key, c] if inside else float32(0)
        tiles[base + KEYS * ROW + key * ROW + c] = v[head, j * KEYS + key, c] if inside else float32(0)


@cuda.jit(device=True)
def warp_max(x):
    offset = 16
    while offset > 0:
        x = max(x, cuda.shfl_xor_sync(FULL, x, offset))
        offset >>= 1
    return x


@cuda.jit(device=True)
def warp_sum(x):
    offset = 16
    while offset > 0:
        x += cuda.shfl_xor_sync(FULL, x, offset)
        offset >>= 1
    return x


# ---------------------------------------------------------------------------------------------
# ch12.1 (complete) — the causal bound of the key loop. With `causal`, query i sees keys 0..i only,
# so the block (queries first .. first + ROWS - 1) needs the keys below `end` and no tile past it:
# set `end`, the number of keys the block's queries see, for both masks. (Keys after a query in
# the last tile are masked per lane below; `end` only decides which tiles are loaded at all.)
#
# ch12.2 (complete) — the online rescale. When tile j's scores raise the row's maximum from m_run
# to m_new, everything summed so far was weighted by e^(s - m_run) and must be weighted by
# e^(s - m_new): multiply it by alpha = e^(m_run - shift), where `shift` is m_new (or 0 while the
# row has no finite score yet: then m_run is -inf too and alpha must be 0, not e^(-inf + inf)).
# Rescale the running sum l_run and the lane's output number acc, then add this tile's sum of p
# (over the warp: warp_sum) to l_run.
#
# ch12.3 (fix) — a row with no finite score. A query whose every score is -inf (or masked) has no
# distribution: its output row is defined as 0. The last lines divide by l_run, which is 0 there.
# A NaN must still reach its row: a query holding a NaN gives a row of NaN, as the reference does.
#
# ch12.4 (fix) — a race between stages. Tile j is read from stage j % 2 while tile j + 1 is loaded
# into the other stage. Run the check: the output is wrong, and in the simulator the sanitizer
# names a thread that writes shared memory another thread reads without a barrier between them.
# Make every tile land where no warp is reading, and the barrier protect both what is read and what
# is overwritten.


@cuda.jit
def attention_rows_kernel(q, k, v, o, causal):
    tiles = cuda.shared.array(STAGES, float32)  # two stages of a K and a V tile
    query = cuda.shared.array((ROWS, D), float32)
    n = q.shape[1]
    head, first = cuda.blockIdx.y, cuda.blockIdx.x * ROWS
    if head >= q.shape[0]:  # a block past the heads (the whole block: no barrier is left waiting)
        return
    warp, lane = cuda.threadIdx.x // WARP, cuda.threadIdx.x % WARP
    row = first + warp
    scale = float32(1 / math.sqrt(D))
    query[warp, lane] = q[head, row, lane] * scale if row < n else float32(0)  # rows past N write nothing
    # >>> ch12.1 (stub ecb54af8)
    end = min(n, first + ROWS) if causal else n
    # <<< ch12.1
    count = (end + KEYS - 1) // KEYS
    load_tile(k, v, tiles, 0, head, 0, n)
    m_run, l_run = NEG_INF, float32(0)
    acc = float32(0)  # output column lane
    for j in range(count):
        # >>> ch12.4 (stub 74a0e05b)
        cuda.syncthreads()  # tile j is in, and every warp is done with tile j - 1's stage
        if j + 1 < count:  # the next tile into the other stage, while this one is used
            load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)
        # <<< ch12.4
        base = (j % 2) * STAGE
        key = j * KEYS + lane
        s = float32(0)
        for c in range(D):
            s += query[warp, c] * tiles[base + lane * ROW + c]
        if key >= n or (causal and key > row):
            s = NEG_INF
        m_new = max(m_run, warp_max(s))
        shift = float32(0) if m_new == NEG_INF else m_new  # no finite score yet: e^(s - 0) = 0
        p = math.exp(s - shift)
        # >>> ch12.2 (stub 1760ad83)
        alpha = math.exp(m_run - shift)
        l_run = l_run * alpha + warp_sum(p)
        acc *= alpha
        # <<< ch12.2
        m_run = m_new
        values = base + KEYS * ROW
        for kk in range(KEYS):  # acc += p of key kk (lane kk's) x V's row kk, column lane
            acc += cuda.shfl_sync(FULL, p, kk) * tiles[values + kk * ROW + lane]
    # >>> ch12.3 (stub a5147e9b)
    inverse = float32(0) if l_run == 0 else float32(1) / l_run
    out = acc * inverse
    # <<< ch12.3
    if row < n:
        o[head, row, lane] = out


def attention_rows(q, k, v, o, causal=False):
    """o = softmax(q k^T / sqrt(32)) v per head; q, k, v, o (heads, N, 32) float32."""
    q = require(q, "q", dtype=np.float32, ndim=3)
    if q.shape[2] != D:
        raise ValueError(f"the exercises' kernel takes a head dimension of {D}, not {q.shape[2]}")
    k = require(k, "k", dtype=np.float32, shape=q.shape)
    v = require(v, "v", dtype=np.float32, shape=q.shape)
    o = require(o, "o", dtype=np.float32, shape=q.shape)
    heads, n = q.shape[:2]
    attention_rows_kernel[(max(1, math.ceil(n / ROWS)), heads), ROWS * WARP](q, k, v, o, causal)
    return o


# Planted wrong answers: each must fail its check (python -m pytest --exercises --solutions).
PLANTED_WRONG_ANSWERS = {
    "ch12.1": [("end = min(n, first + ROWS) if causal else n", "end = min(n, first) if causal else n"),  # the block's own keys left out
               ("end = min(n, first + ROWS) if causal else n", "end = n", "simulator"),  # every tile loaded: right, slow
               ("end = min(n, first + ROWS) if causal else n", "end = min(n, first + KEYS) if causal else n",
                "simulator")],  # a tile, not the queries: a tile too many, traced
    "ch12.2": [("        alpha = math.exp(m_run - shift)\n", "        alpha = float32(1)\n"),  # no rescale
               ("        alpha = math.exp(m_run - shift)\n", "        alpha = math.exp(shift - m_run)\n"),  # inverted
               ("        acc *= alpha\n", ""),  # the sum rescaled, the output not
               ("l_run = l_run * alpha + warp_sum(p)", "l_run = l_run * alpha + p")],  # one lane's share
    "ch12.3": [("    inverse = float32(0) if l_run == 0 else float32(1) / l_run\n",
                "    inverse = float32(1) / l_run\n"),  # the stub: 0 / 0
               ("    inverse = float32(0) if l_run == 0 else float32(1) / l_run\n",
                "    inverse = float32(1) / l_run if l_run == l_run else float32(0)\n")],  # tests NaN, not 0
    "ch12.4": [("load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)", "load_tile(k, v, tiles, j % 2, head, j + 1, n)"),  # the stub
               ("        cuda.syncthreads()  # tile j is in, and every warp is done with tile j - 1's stage\n", "",
                "simulator"),  # no barrier: a warp may read a tile before it lands, or overwrite one still read
               ("        cuda.syncthreads()  # tile j is in, and every warp is done with tile j - 1's stage\n"
                "        if j + 1 < count:  # the next tile into the other stage, while this one is used\n"
                "            load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)\n",
                "        if j + 1 < count:  # the next tile into the other stage, while this one is used\n"
                "            load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)\n"
                "        cuda.syncthreads()  # tile j is in, and every warp is done with tile j - 1's stage\n",
                "simulator"),  # the load overwrites the stage a slower warp still reads (tile j - 1's)
               ("        cuda.syncthreads()  # tile j is in, and every warp is done with tile j - 1's stage\n"
                "        if j + 1 < count:  # the next tile into the other stage, while this one is used\n"
                "            load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)\n",
                "        if j + 1 < count:  # the next tile into the other stage, while this one is used\n"
                "            cuda.syncthreads()\n"
                "            load_tile(k, v, tiles, (j + 1) % 2, head, j + 1, n)\n",
                "simulator")],  # no barrier before the last tile is read
}
