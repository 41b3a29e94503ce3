"""Step 7: the wavefront on tensor cores, FP16 weights and h, FP32 sums and state.

The wavefront (wavefront.py) keeps both weight matrices of a block's units on chip and runs every
layer in one persistent kernel. Here each step's product is done with chapter 09's warp-wide
`mma.sync` (m16n8k16: a 16 x 16 tile of FP16 weights times a 16 x 8 tile of FP16 h, summed in FP32):
- a block's gate rows (4 per unit: unit u's gate q is row 4u + q) times [x_t ; h_{t-1}] is one
  GEMM with K = 2H (the layer's input beside its recurrent state; H for the first layer, whose
  input term is step 2's hoisted GEMM, so its W_ih part is zeros);
- the weights are stored in FP16, already in the A fragments' order (`fragments`, on the host):
  half the bytes of FP32, so both matrices fit in shared memory, and lane L of a warp reads its
  four registers of a tile as four conflict-free words;
- the k of the GEMM are split over the block's warps; each warp loads its slice of [x_t ; h_{t-1}]
  for 8 batch rows an n-tile straight from global memory (two float32 made one register of two
  FP16: `pack_f16x2`), every load in flight before the first mma;
- the warps' partial sums meet in shared memory, and a thread per (unit, batch row) adds them and
  computes the cell in FP32.
A block takes NB = 8 * NT batch rows at a time (NT n-tiles): as many as its accumulators (MT m-tiles
x NT n-tiles x 4 floats) and shared memory allow."""

from functools import lru_cache

import numba
import numpy as np
from numba import cuda, float32

from workbook import ON_GPU, capability
from workbook.barrier import counter_barrier, counter_leave
from workbook.inputs import sm_count
from workbook.launch import cdiv, shared_memory_limit
from workbook.tensor_cores import fragment_coordinates, mma_f16, pack_f16x2

from .fused import FusedLSTM
from .layer import lstm_cell
from workbook.launch import cooperative_launch

THREADS = 512 if ON_GPU else 64
WARPS = THREADS // 32
MAX_TILES = 8  # m-tiles x n-tiles a warp accumulates: 32 floats a thread
PITCH = 33  # words between a C register's 32 lanes and the next's: the cells read them without bank conflicts
ZERO = float32(0.0)


def geometry(hidden, units, layers):
    """(MT, XP, KT, KSW): the block's m-tiles (16 gate rows each), the width of the input part of
    K (0 for one layer alone), the k-steps of 16 in all and those a warp takes."""
    mt = -(-4 * units // 16)
    hp = 16 * cdiv(hidden, 16)  # each part padded to whole k-steps with zeros
    xp = hp if layers > 1 else 0
    kt = (xp + hp) // 16
    return mt, xp, kt, cdiv(kt, WARPS)


def shared_words(hidden, units, layers, nt):
    """32-bit words of a block's shared memory: the weight fragments, the warps' partial sums."""
    mt, _, _, ksw = geometry(hidden, units, layers)
    return ksw * WARPS * mt * 128 + WARPS * mt * nt * 4 * PITCH


def n_tiles(hidden, units, layers, batch):
    """n-tiles (8 batch rows each) a block takes at once: a power of 2, no more than the batch needs,
    than MAX_TILES accumulator tiles and than the shared memory holds; 0 if not even one fits."""
    mt = geometry(hidden, units, layers)[0]
    nt = 1
    while 8 * nt < batch and mt * nt * 2 <= MAX_TILES:
        nt *= 2
    while nt and 4 * shared_words(hidden, units, layers, nt) > shared_memory_limit():
        nt //= 2
    return nt if mt <= MAX_TILES else 0


def fragments(weights, units, blocks_per_layer):
    """Every block's weights as FP16 A fragments, (blocks, KSW * WARPS, MT, 4, 32) uint32: for
    k-step ks and m-tile mt, register r of lane L, as mma.m16n8k16 wants it (two FP16 in a word).
    A block's matrix: rows 4u + q (unit u, gate q), columns [W_ih | W_hh], each part padded to a
    multiple of 16; the first layer's W_ih part is zeros (its input term is the hoisted GEMM's)."""
    layers, hidden = len(weights), weights[0]["w_hh"].shape[1]
    mt, xp, _, ksw = geometry(hidden, units, layers)
    hp, kp = 16 * cdiv(hidden, 16), 16 * ksw * WARPS
    a = fragment_coordinates("f16")["a"]  # (32 lanes, 4 registers, (row, column))
    out = np.zeros((layers * blocks_per_layer, ksw * WARPS, mt, 4, 32), np.uint32)
    for layer, w in enumerate(weights):
        for blk in range(blocks_per_layer):
            rows = np.zeros((16 * mt, kp), np.float16)
            for u in range(units):
                j = blk * units + u
                if j >= hidden:
                    break
                for q in range(4):
                    if layer > 0 and xp:
                        rows[4 * u + q, :hidden] = w["w_ih"][q * hidden + j]
                    rows[4 * u + q, xp:xp + hidden] = w["w_hh"][q * hidden + j]
            pairs = rows.view(np.uint32).reshape(mt, 16, kp // 16, 8)  # two FP16 a word: columns 2c, 2c + 1
            # register r of lane L holds (row, column) a[L, r] of its tile and the next column
            out[layer * blocks_per_layer + blk] = pairs[:, a[..., 0], :, a[..., 1] // 2].transpose(3, 2, 1, 0)
    return out


@lru_cache(maxsize=None)
def make_half_kernel(H, U, L, NT):
    """The kernel for hidden size H, U units a block, L layers, NT n-tiles (8 batch rows each) at once."""
    MT, XP, KT, KSW = geometry(H, U, L)
    WB = KSW * WARPS * MT * 128  # a block's fragment words
    NB = 8 * NT  # batch rows at once
    TILES = MT * NT  # a warp's C tiles; its partial sums in shared memory after the fragments:
    PS = WB  # register r of tile i, lane L of warp w at PS + ((w * TILES + i) * 4 + r) * PITCH + L
    CPT = -(-U * NB // THREADS)  # cells a thread computes a chunk
    ACC, BVALS, XS = 4 * MT * NT, 4 * KSW * NT, 4 * CPT  # local arrays' sizes: plain names
    EVEN = H % 16 == 0  # no k past H in any k-step: no test per value
    options = {"launch_bounds": (THREADS, 1)} if ON_GPU else {}

    @cuda.jit(device=True, forceinline=True)
    def operand(y, h, layer, t, T, B, b, ks, k):
        """[x_t ; h_{t-1}] at row k of k-step ks (uniform across a warp), batch row b: the float32 value,
        zero past the ends and in the first layer's input part."""
        u64 = numba.uint64
        if ks * u64(16) < u64(XP):  # the input part: h_t of the layer below
            if layer == u64(0) or b >= B or not (EVEN or k < u64(H)):
                return ZERO
            return y[(((layer - u64(1)) * T + t) * B + b) * u64(H) + k]
        k -= u64(XP)
        if ks >= u64(KT) or b >= B or not (EVEN or k < u64(H)):
            return ZERO
        if t == u64(0):
            return h[(layer * B + b) * u64(H) + k]
        return y[((layer * T + t - u64(1)) * B + b) * u64(H) + k]

    @cuda.jit(device=True, forceinline=True)
    def stage(nxt, y, h, layer, t, T, B, b0, ks0, g, q4):
        """The values of [x_t ; h_{t-1}] this lane's B registers take for the chunk at batch row b0,
        as float32: loads, in flight until the chunk's mma packs them."""
        u64 = numba.uint64
        for i in range(KSW):
            ks = ks0 + u64(i)
            for nt in range(NT):
                b = b0 + u64(nt * 8) + g
                for r in range(2):  # register r: k and k + 1, 8 apart from register 0's
                    k = ks * u64(16) + u64(8 * r) + u64(2) * q4
                    for e in range(2):
                        nxt[((i * NT + nt) * 2 + r) * 2 + e] = operand(y, h, layer, t, T, B, b, ks, k + u64(e))

    @cuda.jit(device=True, forceinline=True)
    def cell_inputs(cs, xs, c, bias, x_terms, layer, t, B, b0, j0, tid):
        """The chunk's cells' inputs that need no h, for the cells this thread computes: c_{t-1}, and
        bias (+ the hoisted input term in the first layer) of each gate. In flight during the mma."""
        u64 = numba.uint64
        for p in range(CPT):
            n = tid + u64(p * THREADS)
            cu, bb = n % u64(U), n // u64(U)
            b, j = b0 + bb, j0 + cu
            if bb < u64(NB) and b < B and j < u64(H):
                cs[p] = c[(layer * B + b) * u64(H) + j]
                for q in range(4):
                    xs[4 * p + q] = bias[layer * u64(4 * H) + u64(q * H) + j]
                    if layer == u64(0):
                        xs[4 * p + q] += x_terms[(t * B + b) * u64(4 * H) + u64(q * H) + j]

    @cuda.jit(device=True, forceinline=True)
    def multiply(acc, words, nxt, ks0, lane):
        """acc = this warp's part of the chunk's gates: its KSW k-steps of the block's weight fragments
        (shared memory) times the staged operands, packed to FP16 pairs, on the tensor cores."""
        u64 = numba.uint64
        for n in range(ACC):
            acc[n] = ZERO
        for i in range(KSW):
            for mt in range(MT):
                at = ((ks0 + u64(i)) * u64(MT) + u64(mt)) * u64(128) + lane
                a = (words[at], words[at + u64(32)], words[at + u64(64)], words[at + u64(96)])
                for nt in range(NT):
                    o, f = (mt * NT + nt) * 4, (i * NT + nt) * 4
                    b_regs = (pack_f16x2(nxt[f], nxt[f + 1]), pack_f16x2(nxt[f + 2], nxt[f + 3]))
                    acc[o], acc[o + 1], acc[o + 2], acc[o + 3] = mma_f16(
                        a, b_regs, (acc[o], acc[o + 1], acc[o + 2], acc[o + 3]))

    @cuda.jit(device=True, forceinline=True)
    def store_partials(part, acc, B, b0, warp, q4, lane):
        """The warp's partial sums to shared memory as mma left them, a register's 32 lanes side by side
        (columns past the batch are not needed)."""
        u64 = numba.uint64
        for mt in range(MT):
            for nt in range(NT):
                for r in range(4):
                    if b0 + u64(nt * 8 + r % 2) + u64(2) * q4 < B:
                        part[u64(PS + ((mt * NT + nt) * 4 + r) * PITCH) + warp * u64(TILES * 4 * PITCH) +
                             lane] = acc[(mt * NT + nt) * 4 + r]

    @cuda.jit(device=True, forceinline=True)
    def cells(c, y, part, xs, cs, z, layer, t, T, B, b0, j0, tid):
        """The cells, a thread per (unit, batch row): each gate's sum over the warps' partial sums, then
        lstm_cell."""
        u64 = numba.uint64
        for p in range(CPT):
            n = tid + u64(p * THREADS)
            cu, bb = n % u64(U), n // u64(U)
            b, j = b0 + bb, j0 + cu
            if bb < u64(NB) and b < B and j < u64(H):
                for q in range(4):  # row 4 cu + q, column bb: tile, register and lane of C
                    row = u64(4) * cu + u64(q)
                    tile = (row // u64(16)) * u64(NT) + bb // u64(8)
                    r = (row % u64(16)) // u64(8) * u64(2) + bb % u64(2)
                    at = u64(PS) + (tile * u64(4) + r) * u64(PITCH) + row % u64(8) * u64(4) + bb % u64(8) // u64(2)
                    z[q] = xs[4 * p + q]
                    for w in range(WARPS):
                        z[q] += part[at + u64(w * TILES * 4 * PITCH)]
                c[(layer * B + b) * u64(H) + j], y[((layer * T + t) * B + b) * u64(H) + j] = \
                    lstm_cell(z[0], z[1], z[2], z[3], cs[p])

    @cuda.jit(**options)
    def half_kernel(x_terms, w_frag, bias, h, c, y, T, B, counter):
        """Flat arrays: x_terms (T, B, 4H) float32, the first layer's hoisted GEMM; w_frag: fragments();
        bias (L, 4H), h and c (L, B, H), y (L, T, B, H) float32. counter: 2 uint64, zero at the launch
        and left at zero."""
        u64 = numba.uint64
        T, B = u64(T), u64(B)
        cuda.cg.this_grid()  # unused but for this: numba launches the kernel cooperatively (all blocks resident)
        words = cuda.shared.array(0, dtype=numba.uint32)  # the fragments ...
        part = cuda.shared.array(0, dtype=float32)  # ... and after them, the partial sums (same memory)
        tid = u64(cuda.threadIdx.x)
        warp, lane = tid // u64(32), tid % u64(32)
        g, q4 = lane // u64(4), lane % u64(4)
        blocks = u64(cuda.gridDim.x)
        per_layer = blocks // u64(L)
        layer = u64(cuda.blockIdx.x) // per_layer
        j0 = (u64(cuda.blockIdx.x) % per_layer) * u64(U)
        base = u64(cuda.blockIdx.x) * u64(WB)
        for n in range(tid, u64(WB), u64(THREADS)):  # once per sequence: the block's weights
            words[n] = w_frag[base + n]
        cuda.syncthreads()
        acc = cuda.local.array(ACC, float32)  # acc[(mt * NT + nt) * 4 + r]: mma's C registers
        nxt = cuda.local.array(BVALS, float32)  # B register (i * NT + nt) * 2 + r: values 2 * that, + 1
        xs = cuda.local.array(XS, float32)
        cs = cuda.local.array(CPT, float32)
        z = cuda.local.array(4, float32)
        ks0 = warp * u64(KSW)  # this warp's k-steps: ks0 .. ks0 + KSW - 1
        for s in range(T + u64(L - 1)):
            if s >= layer and s - layer < T:
                t = s - layer
                stage(nxt, y, h, layer, t, T, B, u64(0), ks0, g, q4)  # the first chunk's operands
                for b0 in range(u64(0), B, u64(NB)):  # NB batch rows a chunk
                    cell_inputs(cs, xs, c, bias, x_terms, layer, t, B, b0, j0, tid)
                    multiply(acc, words, nxt, ks0, lane)
                    cuda.syncthreads()  # the last chunk's cells are done with the partial sums
                    store_partials(part, acc, B, b0, warp, q4, lane)
                    if b0 + u64(NB) < B:  # the next chunk's operands: in flight during this chunk's cells
                        stage(nxt, y, h, layer, t, T, B, b0 + u64(NB), ks0, g, q4)
                    cuda.syncthreads()
                    cells(c, y, part, xs, cs, z, layer, t, T, B, b0, j0, tid)
            counter_barrier(counter, (s + u64(1)) * blocks)  # every h of wavefront step s written
        for n in range(tid, u64(U) * B, u64(THREADS)):
            cu, b = n % u64(U), n // u64(U)
            if j0 + cu < u64(H):
                h[(layer * B + b) * u64(H) + j0 + cu] = y[((layer * T + T - u64(1)) * B + b) * u64(H) + j0 + cu]
        counter_leave(counter, blocks)  # ready for the next launch

    return half_kernel


class HalfLSTM(FusedLSTM):
    """Step 2's input GEMM for the first layer (FP32), then one cooperative launch for every layer
    and step, the recurrent products on FP16 tensor cores."""

    def __init__(self, weights, blocks=None):
        if not capability.supports("mma.sync.f16"):
            raise ValueError(capability.message("mma.sync.f16", what="the FP16 tensor-core LSTM"))
        super().__init__(weights)
        L, H = self.layers, self.hidden
        largest = float(np.finfo(np.float16).max)
        for layer, w in enumerate(weights):
            for name in ("w_ih", "w_hh") if layer else ("w_hh",):
                if not np.all(np.abs(w[name]) <= largest):  # NaN fails this too
                    raise ValueError(f"layer {layer} {name} holds a value that FP16 cannot (NaN, Inf or beyond "
                                     f"+-{largest:g}): this LSTM keeps it in FP16; use WavefrontLSTM (float32)")
        resident = sm_count() if blocks is None else blocks  # one block an SM
        if resident < L:
            raise ValueError(f"{L} layers need at least {L} blocks, one a layer; {resident} given")
        self.units = cdiv(H, resident // L)
        per_layer = cdiv(H, self.units)
        self.blocks = L * per_layer
        if n_tiles(H, self.units, L, 1) == 0:
            raise ValueError(f"hidden size {H} over {per_layer} blocks a layer gives each block {self.units} units: "
                             f"their FP16 weights ({4 * shared_words(H, self.units, L, 1)} bytes with the partial "
                             f"sums) do not fit in the {shared_memory_limit()} bytes of shared memory, or their "
                             f"{4 * self.units} rows in {MAX_TILES} tiles: use more blocks")
        self.w_frag = cuda.to_device(fragments(weights, self.units, per_layer).reshape(-1))
        self.bias_all = cuda.to_device(np.stack([w["b_ih"] + w["b_hh"] for w in weights]))
        self.counter = cuda.to_device(np.zeros(2, np.uint64))  # the grid barrier's; each launch leaves it at zero

    def _layers(self, x, h_n, c_n, stream):
        T, B, _ = x.shape
        H, L = self.hidden, self.layers
        nt = n_tiles(H, self.units, L, B)
        x_terms = self.input_terms(0, x, stream)
        y = self._buffer("y, every layer", (L, T, B, H), stream)
        cooperative_launch(make_half_kernel(H, self.units, L, nt), self.blocks, THREADS,
                           4 * shared_words(H, self.units, L, nt), stream,
                           x_terms.reshape(-1), self.w_frag, self.bias_all.reshape(-1), h_n.reshape(-1),
                           c_n.reshape(-1), y.reshape(-1), np.int64(T), np.int64(B), self.counter)
        return y[L - 1]
