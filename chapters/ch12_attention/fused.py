"""Fused attention forward (FlashAttention-2's structure): O = softmax(Q K^T * scale) V with nothing
of size N x N ever written.

A block owns BM = 128 queries of one head; each of its 4 warps owns 32 of them, two m16 blocks of
rows (`MI`). Then, for every tile of keys (`KEYS`: 64 at d = 64, 32 at d = 128):

- **K and V stream through shared memory.** Two stages: while the warps work on tile j, cp.async
  brings tile j + 1 into the other stage. Q's tile has a room of its own, copied once; its
  fragments are read from there at every tile (registers are what this kernel runs short of).
- **S lives in registers.** A warp's 32-row block of S = Q K^T is 2 x BN / 8 mma accumulator
  tiles: each lane holds 4 scores of each, 2 of row g (= lane / 4) and 2 of row g + 8 of each m16
  block.
  Every K fragment (one ldmatrix) feeds both m16 blocks: twice the mma per byte read from shared
  memory that a 16-row warp gets, and shared memory's bandwidth is what a 16-row warp runs out of.
- **The online softmax.** Each row keeps its running maximum m and sum l. A new tile's maximum m'
  rescales what was summed so far by 2^((m - m')·scale·log2 e): l and the row's block of O alike.
  The four lanes of a row (lane % 4) agree on m' with two shuffles; l stays a partial sum per lane
  until the end.
- **P V on the tensor cores.** The mma's accumulator layout (row g, columns 2t, 2t + 1) is the A
  fragment's layout, so P goes from S's registers straight into the next mma, rounded to FP16 two
  at a time; V's fragments come by ldmatrix.trans, each feeding both m16 blocks too.

Masks: keys past N, and with `causal` keys after the query, score -inf (so a NaN in a masked score
cannot enter its row). A causal block stops at its last query's tile: tiles after it are never
loaded, and its blocks run last queries first (they have the most tiles). A row whose every score is -inf sums to l = 0 and is written as 0, not 0/0. A NaN in a
query reaches its row's output only (a NaN in V is multiplied by the masked keys' zero weights of
its tile, and 0 x NaN is NaN).

make_forward(d, causal, precision) compiles one kernel per head dimension (64 or 128), mask and
input format ("f16", or "bf16": BF16's bits in uint16 arrays, mma_bf16, P and O rounded to BF16):
every loop then has a constant trip count, unrolled, and the arrays below are registers.
"""

import math

import numpy as np
from numba import cuda, float32, uint32

from workbook.tensor_cores import cp_async_commit, cp_async_wait, mma_bf16, mma_f16, pack_bf16x2, pack_f16x2

from .tiles import ROWS, THREADS, tile_ops

MI = 2  # m16 blocks of rows a warp
WARPS = THREADS // 32
BM = 16 * MI * WARPS  # queries of a block
KEYS = {64: 64, 128: 32}  # keys of a tile, by head dimension: at d = 128 the registers run out first
FULL = 0xFFFFFFFF
NEG_INF = float32(-math.inf)


def shared_bytes(d, keys=None):
    """Q's tile, then two stages of a K and a V tile."""
    return (BM + 2 * 2 * (keys or KEYS[d])) * d * 2


def make_forward(d, causal, keys=None, precision="f16"):
    BN = keys or KEYS[d]
    steps = (BN // 16) * (d // 64)  # of O += P V: 16 keys and 64 columns of O each
    assert MI == 2 and steps <= 8, "the kernel calls its per-row and per-step functions one by one, for MI = 2"
    tile = BN * d  # halves in a K or V tile
    k_steps = d // 16  # depth steps of Q K^T
    key_tiles = BN // 8  # n8 tiles of S a row block holds
    out_tiles = d // 8  # n8 tiles of O
    s_values, o_values, p_registers = MI * 4 * key_tiles, MI * 4 * out_tiles, MI * 2 * key_tiles
    rows = 2 * MI  # rows a lane holds: g and g + 8 of each m16 block
    q_room = BM * d
    copy_q, row_fragments, _, _ = tile_ops(d)
    copy, _, key_fragments, value_fragments = tile_ops(d, BN)
    # BF16: the same kernel on BF16's bits (uint16 arrays), mma_bf16, and P and O rounded to BF16
    element = np.float16 if precision == "f16" else np.uint16
    mma = mma_f16 if precision == "f16" else mma_bf16
    pack = pack_f16x2 if precision == "f16" else pack_bf16x2

    if precision == "f16":
        @cuda.jit(device=True, forceinline=True)
        def store_pair(o, head, row, col, lo, hi):
            o[head, row, col], o[head, row, col + 1] = lo, hi
    else:
        @cuda.jit(device=True, forceinline=True)
        def store_pair(o, head, row, col, lo, hi):
            bits = pack_bf16x2(lo, hi)
            o[head, row, col], o[head, row, col + 1] = bits & 0xFFFF, bits >> 16

    @cuda.jit(device=True, forceinline=True)
    def stage_of(j):
        return q_room + (j % 2) * 2 * tile  # K at +0, V at +tile

    @cuda.jit(device=True, forceinline=True)
    def copy_tile(smem, j, k, v, head_start, n, tid):
        start = head_start + j * BN * d
        copy(smem, stage_of(j), k, start, d, n - j * BN, tid)
        copy(smem, stage_of(j) + tile, v, start, d, n - j * BN, tid)

    @cuda.jit(device=True, forceinline=True)
    def multiply_keys(smem, k_at, s, kk, warp, lane):
        """S += Q K^T for depth 16kk..16kk+15: each K fragment feeds both m16 blocks."""
        a0 = row_fragments(smem, 0, 16 * MI * warp, kk, lane)
        a1 = row_fragments(smem, 0, 16 * MI * warp + 16, kk, lane)
        for jp in range(0, key_tiles, 2):
            b = key_fragments(smem, k_at, jp, kk, lane)
            for h in range(2):
                for mi in range(MI):
                    a = a0 if mi == 0 else a1
                    x = 4 * (mi * key_tiles + jp + h)
                    out = mma(a, (b[2 * h], b[2 * h + 1]), (s[x], s[x + 1], s[x + 2], s[x + 3]))
                    for r in range(4):
                        s[x + r] = out[r]

    @cuda.jit(device=True, forceinline=True)
    def online_softmax(s, acc, pa, m_run, l_run, mi, half, scale_log2):
        """Row g + 8·half of m16 block mi: its new maximum, the rescale of its sum and its O, its P."""
        row = 2 * mi + half
        top = m_run[row]
        for jt in range(key_tiles):
            x = 4 * (mi * key_tiles + jt) + 2 * half
            top = max(top, max(s[x], s[x + 1]))
        top = max(top, cuda.shfl_xor_sync(FULL, top, 1))  # the four lanes of a row
        top = max(top, cuda.shfl_xor_sync(FULL, top, 2))
        # a row with no finite score yet subtracts 0, so that exp2(-inf - 0) = 0, not NaN
        shift = float32(0) if top == NEG_INF else top * scale_log2
        alpha = math.exp2(m_run[row] * scale_log2 - shift)
        m_run[row] = top
        total = l_run[row] * alpha
        for c in range(out_tiles):
            x = 4 * (mi * out_tiles + c) + 2 * half
            acc[x] *= alpha
            acc[x + 1] *= alpha
        for jt in range(key_tiles):
            x = 4 * (mi * key_tiles + jt) + 2 * half
            p0 = math.exp2(s[x] * scale_log2 - shift)
            p1 = math.exp2(s[x + 1] * scale_log2 - shift)
            total += p0 + p1
            # tile jt's accumulator is half of an A fragment of keys 16(jt // 2)..: a0 (row g) and
            # a1 (row g + 8) of an even tile, a2 and a3 of an odd one
            pa[mi * 2 * key_tiles + 2 * jt + half] = pack(p0, p1)
        l_run[row] = total

    @cuda.jit(device=True, forceinline=True)
    def multiply_values(smem, v_at, pa, acc, step, lane):
        """O += P V for keys 16ks..16ks+15 of the tile and columns 64·c64.. of O (step = c64·BN/16
        + ks): each V fragment feeds both m16 blocks."""
        ks, c0 = step % (BN // 16), 8 * (step // (BN // 16))
        for c in range(c0, c0 + 8, 2):
            b = value_fragments(smem, v_at, ks, c, lane)
            for h in range(2):
                for mi in range(MI):
                    p = mi * 2 * key_tiles + 4 * ks
                    x = 4 * (mi * out_tiles + c + h)
                    out = mma((pa[p], pa[p + 1], pa[p + 2], pa[p + 3]), (b[2 * h], b[2 * h + 1]),
                                  (acc[x], acc[x + 1], acc[x + 2], acc[x + 3]))
                    for r in range(4):
                        acc[x + r] = out[r]

    @cuda.jit(fastmath={"contract", "afn"})
    def attention_forward(q, k, v, o, scale_log2):
        """o = softmax(q k^T scale) v per head; q, k, v, o (heads, N, d); scale_log2 = scale·log2 e."""
        smem = cuda.shared.array(0, element)
        n = q.shape[1]
        head, block = cuda.blockIdx.y, cuda.blockIdx.x
        if causal:  # the last queries see the most keys: their blocks start first, the short ones fill in
            block = cuda.gridDim.x - 1 - block
        m0 = block * BM
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        head_start = head * n * d
        first_row = m0 + 16 * MI * warp  # the warp's rows: first_row + 16 mi + g (+ 8)

        tiles = (n + BN - 1) // BN
        if causal:
            tiles = min(tiles, (m0 + BM + BN - 1) // BN)  # the last tile holding a key <= the last query

        for half in range(BM // ROWS):  # Q's tile, 64 rows at a time, and tile 0 of K and V: one group
            copy_q(smem, half * ROWS * d, q, head_start + (m0 + half * ROWS) * d, d, n - m0 - half * ROWS, tid)
        copy_tile(smem, 0, k, v, head_start, n, tid)
        cp_async_commit()

        acc = cuda.local.array(o_values, float32)
        for i in range(o_values):
            acc[i] = 0
        s = cuda.local.array(s_values, float32)
        pa = cuda.local.array(p_registers, uint32)
        m_run = cuda.local.array(rows, float32)  # each row's running maximum
        l_run = cuda.local.array(rows, float32)  # and this lane's share of its running sum
        for r in range(rows):
            m_run[r] = NEG_INF
            l_run[r] = 0

        for j in range(tiles):
            if j + 1 < tiles:  # tile j + 1 into the other stage, while this one is used
                copy_tile(smem, j + 1, k, v, head_start, n, tid)
            cp_async_commit()  # empty on the last tile: the count of groups stays right
            cp_async_wait(1)  # tile j (and Q) have landed
            cuda.syncthreads()
            base = stage_of(j)

            # S = Q K^T for the warp's 32 rows and the tile's keys, 16 of the depth at a time
            for i in range(s_values):
                s[i] = 0
            multiply_keys(smem, base, s, 0, warp, lane)
            multiply_keys(smem, base, s, 1, warp, lane)
            multiply_keys(smem, base, s, 2, warp, lane)
            multiply_keys(smem, base, s, 3, warp, lane)
            if k_steps > 4:
                multiply_keys(smem, base, s, 4, warp, lane)
                multiply_keys(smem, base, s, 5, warp, lane)
                multiply_keys(smem, base, s, 6, warp, lane)
                multiply_keys(smem, base, s, 7, warp, lane)

            key0 = j * BN
            if key0 + BN > n or (causal and key0 + BN > first_row):  # a key past N or after a query
                for mi in range(MI):
                    for jt in range(key_tiles):
                        for r in range(4):
                            key = key0 + 8 * jt + 2 * t + r % 2
                            row = first_row + 16 * mi + g + 8 * (r // 2)
                            if key >= n or (causal and key > row):
                                s[4 * (mi * key_tiles + jt) + r] = NEG_INF

            # the online softmax, a row at a time (g and g + 8 of each m16 block), then O += P V a
            # key step at a time: written out, so that every index into the register arrays is a
            # constant once inlined (the compiler unrolls loops only so far)
            online_softmax(s, acc, pa, m_run, l_run, 0, 0, scale_log2)
            online_softmax(s, acc, pa, m_run, l_run, 0, 1, scale_log2)
            online_softmax(s, acc, pa, m_run, l_run, 1, 0, scale_log2)
            online_softmax(s, acc, pa, m_run, l_run, 1, 1, scale_log2)
            multiply_values(smem, base + tile, pa, acc, 0, lane)
            if steps > 1:
                multiply_values(smem, base + tile, pa, acc, 1, lane)
            if steps > 2:
                multiply_values(smem, base + tile, pa, acc, 2, lane)
                multiply_values(smem, base + tile, pa, acc, 3, lane)
            if steps > 4:
                multiply_values(smem, base + tile, pa, acc, 4, lane)
                multiply_values(smem, base + tile, pa, acc, 5, lane)
                multiply_values(smem, base + tile, pa, acc, 6, lane)
                multiply_values(smem, base + tile, pa, acc, 7, lane)
            cuda.syncthreads()  # every warp is done with this stage before it is refilled

        for mi in range(MI):
            for half in range(2):
                row_index = 2 * mi + half
                total = l_run[row_index]
                offset = 1
                while offset < 4:  # the 4 lanes of a row's quad
                    total += cuda.shfl_xor_sync(FULL, total, offset)
                    offset <<= 1
                # every score -inf: l = 0 and O = 0, written as 0 (a NaN's l is NaN and stays so)
                inverse = float32(0) if total == 0 else float32(1) / total
                row = first_row + 16 * mi + g + 8 * half
                if row < n:
                    for c in range(out_tiles):
                        x = 4 * (mi * out_tiles + c) + 2 * half
                        col = 8 * c + 2 * t
                        store_pair(o, head, row, col, acc[x] * inverse, acc[x + 1] * inverse)

    return attention_forward
