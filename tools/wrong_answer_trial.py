"""A trial of the exercise checks: plausible wrong answers, written fresh (not the planted ones of
solutions.py), graded as a student's answer is graded (`workbook.exercises.evaluate`: strict
simulator, sanitizer, other grids).

    python tools/wrong_answer_trial.py [ch03 ...] [--fresh] [--store]

    ch03 ...   only these chapters
    --fresh    only the second set (FRESH); without it both ANSWERS ("first") and FRESH ("fresh")
    --store    write the rows to results/wrong_answer_trial.json

Each answer is one edit of the reference answer, in one of the classes that lucky code falls in:
  grid   launch geometry: a stride by the block, an index from threadIdx, a block or grid size
         hard-coded, no grid-stride loop (right only while the data fits one launch's threads)
  data   wrong for some values: H for W, a max started at 0, NaN or -inf forgotten, signed for
         unsigned, a carry lost
  index  an index or mask past what the data has: named by the sanitizer's memcheck or synccheck
  point  right only at a particular point of the input space: a constant equal to a default
         parameter, a step or loop count right for some residues of a size only, a size assumed a
         multiple of the tile or the warp, a shuffle direction hidden by data symmetric across
         lanes, a count where a flag is expected (right while only one bad value is planted)
  order  depends on the order threads run in: a plain read racing an atomic update of the same
         word, a missing or too narrow barrier (syncwarp for syncthreads, syncthreads for
         grid.sync), a flag that a later thread can clear
  waste  the right values, with work done several times: not wrong, but not what was asked
A "waste" answer must be graded too slow (in the simulator, on the bytes its kernels move against
the reference answer's: exercises.wasted_work), every other one not passed. Each row is tagged with
its set ("trial": "first" or "fresh"), and the summary counts the two sets apart. Every edit is
checked to apply (its text once in the reference answer's region) before anything is graded. A
maintainer's tool.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WORKBOOK_DEVICE", "sim")
os.environ.setdefault("WORKBOOK_COMPILE", "0")  # wrong answers need no GPU compile

from workbook import exercises as ex  # noqa: E402

CLASSES = ("grid", "data", "index", "point", "order", "waste")

# exercise: [(class, old, new, what the student got wrong)]
ANSWERS = {
    "ch00.1": [("grid", "i += cuda.gridsize(1)", "i += cuda.blockDim.x", "strides by the block: blocks overlap"),
               ("grid", "i += cuda.gridsize(1)", "i += 256 * cuda.gridDim.x", "the block size hard-coded")],
    "ch00.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x", "the index of the first block only"),
               ("waste", "    if i < n:  # the last block is partly past the end\n        dst[i] = src[n - 1 - i]",
                "    for j in range(n):\n        dst[j] = src[n - 1 - j]", "every thread reverses the whole array")],
    "ch00.3": [("index", "    if i < n:\n        dst[i] = src[i]", "    dst[i] = src[i]", "the tail without its test")],
    "ch00.4": [("grid", "col, row = cuda.grid(2)", "row, col = cuda.grid(2)", "x along the rows"),
               ("waste", "        dst[row, col] = src[row, col]",
                "        for _ in range(2):\n            dst[row, col] = src[row, col]", "each element copied twice")],
    "ch01.1": [("data", "v > ZERO", "not (v <= ZERO)", "NaN counted as positive")],
    "ch01.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x + cuda.blockIdx.x * 256", "the block size hard-coded"),
               ("index", "if i < out.size:", "if i < mask.size * 32:", "the padding bits of the last word")],
    "ch01.3": [("data", "dy[i] if bit else ZERO", "dy[i] * bit", "a product, not a select: inf * 0")],
    "ch01.4": [("grid", "step = (cuda.gridsize(1) >> 5) * ROWS_PER_TRIP",
                "step = (cuda.blockDim.x >> 5) * ROWS_PER_TRIP", "strides by the block: warps overlap")],
    "ch02.1": [("data", "off_lo, off_hi, seed_lo, seed_hi)", "off_lo, np.uint32(0), seed_lo, seed_hi)",
                "the offset's high word dropped")],
    "ch02.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x", "the index of the first block only"),
               ("data", "dy[i] * scale if (word >> (i & 31)) & 1 else ZERO", "dy[i] * scale * ((word >> (i & 31)) & 1)",
                "a product, not a select: inf * 0")],
    "ch02.3": [("data", "keep = flag and i < n", "keep = flag", "bits past n set")],
    "ch02.4": [("data", "dx[i] = dy[i] * scale if keep else ZERO", "dx[i] = dy[i] * scale * keep",
                "a product, not a select: inf * 0")],
    "ch03.1": [("data", "if not math.isfinite(value):", "if value != value or value == math.inf:", "-inf missed")],
    "ch03.2": [("data", "middle = (low + high + 1) >> 1", "middle = (low + high) >> 1",
                "the midpoint rounded down: low = middle never moves"),
               ("data", "low, high = 0, count - 1", "low, high = 0, count - 2", "the last tensor never found")],
    "ch03.3": [("grid", "range(start, grad.size, stride)", "range(start, grad.size, cuda.blockDim.x)",
                "strides by the block: elements scaled twice")],
    "ch03.4": [("grid", "if cuda.grid(1) != 0:", "if cuda.threadIdx.x != 0:", "one thread per block, not per grid")],
    "ch04.1": [("data", "0 <= w < W", "0 <= w < H", "H for W"),
               ("data", "h = h0 + table[1, row]\n            w = w0 + table[2, row]",
                "h = h0 + table[2, row]\n            w = w0 + table[1, row]", "the table's rows swapped")],
    "ch04.2": [("grid", "col, row = cuda.grid(2)", "row, col = cuda.grid(2)", "x along the rows")],
    "ch04.3": [("data", "(depth + TILE - 1) // TILE", "depth // TILE", "the partial step lost"),
               ("waste", "(depth + TILE - 1) // TILE", "depth // TILE + 1", "a step of zeros where depth is whole")],
    "ch04.4": [("data", "h = p * sh - ph + r * dh", "h = p * sh - ph + r * dw", "the dilations swapped"),
               ("data", "p = (index // Q) % P", "p = (index // P) % P", "P for Q")],
    "ch05.1": [("data", "(np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) >> np.int32(1)", "(a[i] >> 1) + (b[i] >> 1)",
                "halves first: the carry and the rounding lost")],
    "ch05.2": [("grid", "c, r = cuda.grid(2)", "r, c = cuda.grid(2)", "x along the rows"),
               ("data", "rr = min(max(r + dr, 0), height - 1)", "rr = min(max(r + dr, 0), width - 1)", "width for height")],
    "ch05.3": [("index", "rr = min(max(r + dr, 0), height - 1)", "rr = min(max(r + dr, 0), height)",
                "the bottom edge clamped one row too far")],
    "ch05.4": [("waste", "start, stride = cuda.grid(1), cuda.gridsize(1)", "start, stride = cuda.grid(1), cuda.blockDim.x",
                "strides by the block: pixels merged several times")],
    "ch06.1": [("index", "cuda.shfl_xor_sync(FULL_MASK, total, offset)", "cuda.shfl_xor_sync(0xFFFF, total, offset)",
                "a mask of half the warp")],
    "ch06.2": [("data", "top = NEG_INF", "top = ZERO", "the max started at 0"),
               ("grid", "row = cuda.grid(1)", "row = cuda.threadIdx.x", "the rows of the first block only")],
    "ch06.3": [("index", "cuda.shfl_xor_sync(FULL_MASK, top, offset)", "cuda.shfl_down_sync(FULL_MASK, top, offset)",
                "only lane 0 ends with the max")],
    "ch06.4": [("data", "        top = NEG_INF", "        top = ZERO", "the max started at 0"),
               ("grid", "row = cuda.grid(1) >> 5", "row = cuda.threadIdx.x >> 5", "the rows of the first block only")],
    "ch08.1": [("data", "w[k, c, R - 1 - r, S - 1 - s]", "w[k, c, R - 1 - r, R - 1 - s]", "R for S")],
    "ch08.2": [("waste", "rows * size, cuda.gridsize(1)", "rows * size, cuda.blockDim.x", "strides by the block")],
    "ch08.3": [("data", "params[i] = w - lr * v", "params[i] = w - lr * (grads[i] + weight_decay * w)",
                "the momentum ignored")],
    "ch08.4": [("waste", "cols, cuda.gridsize(1) // 32)", "cols, cuda.blockDim.x // 32)", "strides by the block")],
}


# A second set, written later and without reading the checks: at least two answers for every
# exercise, in the classes above and these: "point" (right only at a particular point of the input
# space: a default parameter hard-coded, a size assumed a multiple of the tile or the warp, data
# symmetric across lanes) and "order" (depends on the order threads run in: a missing barrier, a
# plain read racing an atomic update).
FRESH = {
    "ch00.1": [("waste", "i += cuda.gridsize(1)", "i += cuda.gridDim.x",
                "gridDim for gridsize: strides by the block count, elements copied many times"),
               ("grid", "i += cuda.gridsize(1)", "i += 2 * cuda.gridsize(1)",
                "two grids a step, as in ch00.3's loop: every other stride skipped")],
    "ch00.2": [("index", "dst[i] = src[n - 1 - i]", "dst[i] = src[n - i]", "off by one: src[n] read for i = 0"),
               ("point", "    n = src.size\n", "    n = cuda.gridsize(1)\n",
                "n from the grid: right only when n is a multiple of the block"),
               ("waste", "i = cuda.grid(1)", "i = cuda.threadIdx.x * cuda.gridDim.x + cuda.blockIdx.x",
                "the index transposed: each element once, lanes gridDim words apart (uncoalesced)")],
    "ch00.3": [("point", "    if i < n:\n", "    if i < n and i + grid > n:\n",
                "> for >=: a thread that stops with i + grid == n drops its element"),
               ("grid", "    if i < n:\n        dst[i] = src[i]",
                "    if cuda.grid(1) < n:\n        dst[cuda.grid(1)] = src[cuda.grid(1)]",
                "the thread's first element, not where the loop stopped: right only when n fits the grid"),
               ("waste", "    if i < n:\n        dst[i] = src[i]",
                "    while i < n:  # the rest, one element at a time\n        dst[i] = src[i]\n        i += 1",
                "the tail walks to the end an element at a time: the last ones copied by many threads")],
    "ch00.4": [("point", "blocks = (math.ceil(cols / TILE_COLS), math.ceil(rows / TILE_ROWS))",
                "blocks = (math.ceil(rows / TILE_COLS), math.ceil(cols / TILE_ROWS))",
                "rows and columns swapped in the grid: right on square matrices only"),
               ("grid", "copy_matrix_kernel[blocks, (TILE_COLS, TILE_ROWS)]",
                "copy_matrix_kernel[blocks, (TILE_ROWS, TILE_COLS)]",
                "the block transposed against the grid: 8 columns a block where the grid counts 32"),
               ("index", "if row < rows and col < cols:", "if row < rows:",
                "the column test dropped: writes past the row when cols is not a multiple of 32")],
    "ch01.1": [("point", "bits = cuda.ballot_sync(FULL_MASK, v > ZERO)", "bits = cuda.any_sync(FULL_MASK, v > ZERO)",
                "a vote's flag, not its word: right only for rows whose one positive is lane 0"),
               ("index", "v > ZERO)", "x[i] > ZERO)", "the vote reads x[i] itself: lanes past n read past the end"),
               ("data", "v > ZERO", "v != ZERO", "nonzero for positive: negatives set their bits")],
    "ch01.2": [("data", "(mask[i >> 5] >> (i & 31)) & 1", "(mask[i >> 5] >> (31 - (i & 31))) & 1",
                "the word read most significant bit first"),
               ("index", "mask[i >> 5]", "mask[i >> 3]", "8 bits a word: words past the mask read"),
               ("data", "(mask[i >> 5] >> (i & 31)) & 1", "mask[i >> 5] & (1 << (i & 31))",
                "the bit left in place: 2^k, not 1, and 0 once truncated to a byte")],
    "ch01.3": [("data", "dx[i] = dy[i] if bit else ZERO", "dx[i] = dy[i] if dy[i] > ZERO else ZERO",
                "ReLU applied to dy, not the mask of x"),
               ("data", "dx[i] = dy[i] if bit else ZERO", "dx[i] = dy[i] * bit if dy[i] == dy[i] else ZERO",
                "NaN guarded, inf forgotten (and a kept NaN zeroed): inf * 0 is NaN")],
    "ch01.4": [("point", "if row + my_row < rows:", "if row < rows:",
                "the store tested per trip: words past the mask unless rows are a multiple of 8"),
               ("grid", "row = (cuda.grid(1) >> 5) * ROWS_PER_TRIP", "row = (cuda.threadIdx.x >> 5) * ROWS_PER_TRIP",
                "the warp's first row from threadIdx: every block starts at row 0"),
               ("waste", "step = (cuda.gridsize(1) >> 5) * ROWS_PER_TRIP", "step = cuda.gridsize(1) >> 5",
                "the step in warps, not rows: each row done 8 times"),
               ("data", "i = first + 32 * j\n            values[j]", "i = first + j\n            values[j]",
                "the loads step by 1, not by a row of 32")],
    "ch02.1": [("point", "np.uint32(quad >> 32)", "np.uint32(0)",
                "the quad's high word dropped: right below 2^32 quads (16 Gi elements)"),
               ("data", "np.uint32(quad & 0xFFFFFFFF), np.uint32(quad >> 32)",
                "np.uint32(quad >> 32), np.uint32(quad & 0xFFFFFFFF)", "the quad's words high first"),
               ("data", "seed_lo, seed_hi)", "seed_hi, seed_lo)", "the key's words swapped")],
    "ch02.2": [("point", "dy[i] * scale", "dy[i] * np.float32(2.0)", "the scale of p = 0.5 hard-coded"),
               ("index", "mask[i >> 5]", "mask[i >> 3]", "8 bits a word: words past the mask read"),
               ("data", "(word >> (i & 31)) & 1", "(word >> (31 - (i & 31))) & 1",
                "the word read most significant bit first")],
    "ch02.3": [("point", "keep = flag and i < n", "keep = flag and (row < mask.size - 1 or lane < (n & 31))",
                "the last row always taken as partial: all its bits 0 when n is a multiple of 32"),
               ("data", "keep = flag and i < n", "keep = flag and i < n - 1", "the last element's bit dropped")],
    "ch02.4": [("point", "    if i < dy.size:\n        dx[i] = dy[i] * scale if keep else ZERO",
                "    dx[i] = dy[i] * scale if keep else ZERO", "no test in _drop: n assumed a multiple of 4"),
               ("data", "keep4(quad, threshold", "keep4(first, threshold", "the element index as the Philox counter"),
               ("data", "dx[i] = dy[i] * scale if keep else ZERO", "dx[i] = dy[i] / scale if keep else ZERO",
                "divided by 1 / (1 - p), not multiplied")],
    "ch03.1": [("point", "found_inf[0] = ONE", "cuda.atomic.add(found_inf, 0, ONE)",
                "a count where a flag is expected: right only with one bad value"),
               ("order", "if not math.isfinite(value):  # checked before the multiply, as PyTorch does\n"
                         "            found_inf[0] = ONE",
                "found_inf[0] = ONE if not math.isfinite(value) else np.float32(0.0)",
                "every thread writes the flag: a finite value written last clears it"),
               ("point", "if not math.isfinite(value):", "if not math.isfinite(value * inv_scale[0]):",
                "tested after the multiply: a finite value that overflows (inv_scale > 1) raises the flag")],
    "ch03.2": [("index", "low, high = 0, count - 1", "low, high = 0, count", "one past the last tensor: starts[count] read"),
               ("waste", "middle = (low + high + 1) >> 1", "middle = low + 1",
                "a linear walk from tensor 0: count steps, not log2(count)"),
               ("data", "low, high = 0, count - 1", "low, high = 1, count - 1", "tensor 0 never found")],
    "ch03.3": [("grid", "for i in range(start, grad.size, stride):", "for i in range(start, min(start + 1, grad.size)):",
                "one element per thread: no grid-stride loop"),
               ("point", "range(start, grad.size, stride)", "range(start, grad.size, 256)",
                "the stride of the default 2 blocks of 128 hard-coded")],
    "ch03.4": [("order", "    if cuda.grid(1) != 0:\n        return  # one thread: four numbers do not need more\n", "",
                "every thread of the launch updates: a race on good_steps and scale"),
               ("point", "if good_steps[0] == interval:", "if good_steps[0] == 3:", "the default interval hard-coded"),
               ("data", "    inv_scale[0] = ONE / scale[0]", "        inv_scale[0] = ONE / scale[0]",
                "inv_scale updated on the good branch only"),
               ("data", "        scale[0] = scale[0] * backoff\n        good_steps[0] = 0\n",
                "        scale[0] = scale[0] * backoff\n", "good_steps not reset by an overflow")],
    "ch04.1": [("point", "0 <= h < H and 0 <= w < W", "h < H and w < W", "only the far edges tested: right at padding 0"),
               ("index", "            value = x_flat[base + table[0, row]] if 0 <= h < H and 0 <= w < W else ZERO",
                "            value = x_flat[base + table[0, row]]\n"
                "            value = value if 0 <= h < H and 0 <= w < W else ZERO",
                "the load before the test: reads past x in the padding"),
               ("index", "0 <= h < H", "0 <= h <= H", "one row past the bottom edge")],
    "ch04.2": [("point", "for kk in range(depth):", "for kk in range(columns):", "N for K: right for square products only"),
               ("index", "if row < rows and col < columns:", "if row < rows:", "the column test dropped"),
               ("point", "total = ZERO", "total = c[row, col]", "accumulates onto c: right only where c starts at 0"),
               ("waste", "        total = ZERO\n        for kk in range(depth):\n"
                         "            total += a[row, kk] * b[kk, col]  # a: a broadcast across the warp; b: coalesced\n"
                         "        c[row, col] = total",
                "        c[row, col] = ZERO\n        for kk in range(depth):\n            c[row, col] += a[row, kk] * b[kk, col]",
                "the sum kept in c: c read and written depth times")],
    "ch04.3": [("point", "(depth + TILE - 1) // TILE", "(depth + TILE // 2) // TILE",
                "rounded to nearest: a last step of 1 to 3 elements lost"),
               ("data", "(depth + TILE - 1) // TILE", "(columns + TILE - 1) // TILE", "N for K: steps over the wrong size"),
               ("waste", "(depth + TILE - 1) // TILE", "depth", "a step per element of depth, not per tile")],
    "ch04.4": [("point", "for s in range(S):", "for s in range(R):", "R for S: square filters only"),
               ("point", "h = p * sh - ph + r * dh", "h = p * sh - ph + r", "the dilation along h forgotten: right at 1"),
               ("data", "w[k, c, r, s]", "w[k, c, R - 1 - r, S - 1 - s]",
                "the filter turned: a convolution, not the cross-correlation asked"),
               ("index", "if index < N * K * P * Q:", "if index <= N * K * P * Q:", "one thread past the end")],
    "ch05.1": [("data", "np.int32(a[i]) + np.int32(b[i])", "np.int8(a[i]) + np.int8(b[i])",
                "signed bytes: pixels of 128 and up read negative"),
               ("data", "(np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) >> np.int32(1)",
                "((np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) & np.int32(0xFF)) >> np.int32(1)",
                "the sum kept to 8 bits: the carry lost for sums of 255 and up")],
    "ch05.2": [("index", "rr = min(max(r + dr, 0), height - 1)", "rr = min(r + dr, height - 1)",
                "the top edge unclamped: row -1 read"),
               ("data", "rr = min(max(r + dr, 0), height - 1)", "rr = min(abs(r + dr), height - 1)",
                "reflected at the top, not clamped: row 1 for row -1"),
               ("index", "if r < height and c < width:", "if r < height:", "the column test dropped: writes past the row")],
    "ch05.3": [("index", "cc = min(max(c + dc, 0), width - 1)", "cc = min(max(c + dc, 0), width)",
                "the right edge clamped one column too far"),
               ("data", "cc = min(max(c + dc, 0), width - 1)", "cc = c + dc if 0 < c < width - 1 else c",
                "an edge column repeats its own pixel instead of clamping the neighbour"),
               ("point", "cc = min(max(c + dc, 0), width - 1)", "cc = min(max(c + dc, 0), max(width, height) - 1)",
                "fixed for wide images only: tall ones read past the row")],
    "ch05.4": [("data", "(x | y) - (((x ^ y) >> np.uint32(1)) & np.uint32(0x7F7F7F7F))",
                "(x & y) + (((x ^ y) >> np.uint32(1)) & np.uint32(0x7F7F7F7F))", "the floor average: halves round down"),
               ("grid", "    for i in range(start, out.size, stride):\n", "    i = start\n    if i < out.size:\n",
                "one word per thread: no grid-stride loop"),
               ("grid", "start, stride = cuda.grid(1), cuda.gridsize(1)", "start, stride = cuda.grid(1), 64 * 256",
                "the wrapper's largest grid hard-coded as the stride")],
    "ch06.1": [("point", "cuda.shfl_xor_sync(FULL_MASK, total, offset)", "cuda.shfl_sync(FULL_MASK, total, offset)",
                "reads lane `offset`, not lane ^ offset: right only where every lane holds the same partial"),
               ("data", "total += cuda.shfl_xor_sync", "total = cuda.shfl_xor_sync", "the partner's sum taken, its own dropped"),
               ("index", "total, offset)", "total, offset << 1)",
                "offsets 32 .. 2: lane ^ 32 is past the warp, bit 0 never exchanged")],
    "ch06.2": [("point", "        for c in range(columns):\n            top = max(top, x[row, c])",
                "        for c in range(1, columns):\n            top = max(top, x[row, c])",
                "the max skips column 0: exp overflows where column 0 alone is far the largest"),
               ("data", "            total += math.exp(x[row, c] - top)", "            total += math.exp(x[row, c])",
                "the max not subtracted in the sum: exp(1e4) overflows"),
               ("index", "if row < x.shape[0]:", "if row <= x.shape[0]:", "one row past the end")],
    "ch06.3": [("point", "cuda.shfl_xor_sync(FULL_MASK, top, offset)", "cuda.shfl_sync(FULL_MASK, top, offset)",
                "reads lane `offset`, not lane ^ offset: right where the max sits in lane 0, 1, 2, 4, 8 or 16"),
               ("data", "top = max(top, cuda.shfl_xor_sync(FULL_MASK, top, offset))",
                "top = cuda.shfl_xor_sync(FULL_MASK, top, offset)", "the partner's max taken, its own dropped")],
    "ch06.4": [("point", "total += cuda.shfl_xor_sync(FULL_MASK, total, offset)",
                "total += cuda.shfl_down_sync(FULL_MASK, total, offset)",
                "the sum by shfl_down: lanes past lane 0 short, right only where every lane's partial is equal"),
               ("data", "        offset = WARP // 2\n        while offset > 0:\n            total +=",
                "        while offset > 0:\n            total +=", "offset not reset: the sum never reduced across lanes"),
               ("waste", "        for c in range(lane, x.shape[1], WARP):\n            top = max(top, x[row, c])",
                "        for c in range(x.shape[1]):\n            top = max(top, x[row, c])",
                "every lane scans the whole row for the max")],
    "ch08.1": [("point", "w[k, c, R - 1 - r, S - 1 - s]", "w[k, c, 2 - r, 2 - s]",
                "R - 1 = 2 hard-coded: right for 3x3 filters only"),
               ("data", "w[k, c, R - 1 - r, S - 1 - s]", "w[k, c, R - 1 - s, S - 1 - r]",
                "r and s swapped: also turned about the diagonal"),
               ("index", "w[k, c, R - 1 - r, S - 1 - s]", "w[k, c, R - r, S - s]", "turned one too far: w[.., R, S] read")],
    "ch08.2": [("grid", "    for i in range(cuda.grid(1), rows * size, cuda.gridsize(1)):\n",
                "    i = cuda.grid(1)\n    if i < rows * size:\n", "no grid-stride loop: the wrapper's 4 blocks cover 512"),
               ("point", "np.float32(1.0) / np.float32(size)", "np.float32(1.0 / 64)", "the capstone's 8x8 plane hard-coded"),
               ("waste", "    for i in range(cuda.grid(1), rows * size, cuda.gridsize(1)):\n        row = i // size\n"
                         "        d_planes[row, i - row * size] = d_out[row] * inverse",
                "    for row in range(cuda.grid(1), rows, cuda.gridsize(1)):\n        for j in range(size):\n"
                "            d_planes[row, j] = d_out[row] * inverse",
                "a thread per plane: lanes write size words apart (uncoalesced)")],
    "ch08.3": [("point", "momentum * velocity[i]", "np.float32(0.9) * velocity[i]", "the default momentum 0.9 hard-coded"),
               ("data", "v = momentum * velocity[i] + (grads[i] + weight_decay * w)",
                "v = momentum * velocity[i] + (1 - momentum) * (grads[i] + weight_decay * w)",
                "dampened like an average: (1 - momentum) on the gradient"),
               ("data", "params[i] = w - lr * v", "params[i] = w - lr * (grads[i] + weight_decay * w + momentum * v)",
                "Nesterov's step where plain momentum is asked")],
    "ch08.4": [("point", "    for col in range(cuda.grid(1) // 32, cols, cuda.gridsize(1) // 32):  # warp-uniform: all lanes shuffle\n"
                         "        partial = ZERO\n",
                "    partial = ZERO\n"
                "    for col in range(cuda.grid(1) // 32, cols, cuda.gridsize(1) // 32):  # warp-uniform: all lanes shuffle\n",
                "the partial sum not reset per column: right only while a warp has one column"),
               ("grid", "cols, cuda.gridsize(1) // 32)", "cols, cuda.gridsize(1))",
                "the column stride in threads, not warps: columns past the grid's warps skipped"),
               ("point", "cuda.shfl_xor_sync(0xFFFFFFFF, partial, offset)", "cuda.shfl_up_sync(0xFFFFFFFF, partial, offset)",
                "shfl_up with lane 0 writing: lane 0 doubles its own, right only where every lane's partial is equal")],
    "ch09.1": [("index", "a3 = to_tf32(at(a, row0 + g + 8, k0 + t + 4))", "a3 = to_tf32(a[row0 + g + 8, k0 + t + 4])",
                "a3 read directly, not through `at`: past the edge unless M % 16 == 0 and K % 8 == 0"),
               ("point", "frag_b = (to_tf32(at(b, k0 + t, col0 + g)), to_tf32(at(b, k0 + t + 4, col0 + g)))",
                "frag_b = (to_tf32(at(b, col0 + g, k0 + t)), to_tf32(at(b, col0 + g, k0 + t + 4)))",
                "B indexed (n, k): right only for a symmetric B")],
    "ch09.2": [("order", "        cuda.syncthreads()  # ... and so have everyone's\n", "",
                "no barrier: each thread waits for its own copies and reads everyone's"),
               ("order", "cuda.syncthreads()  # ... and so have everyone's", "cuda.syncwarp()  # ... and so have everyone's",
                "a warp barrier where the block's is needed: a column's rows come from all four warps")],
    "ch09.3": [("data", "(lane % 16) * 16 + (lane // 16) * 8",
                "((lane % 8) + 8 * (lane // 16)) * 16 + ((lane // 8) % 2) * 8",
                "the matrices in reading order (top-left, top-right, ...), not the mma's (top-left, bottom-left, ...)"),
               ("index", "(lane % 16) * 16 + (lane // 16) * 8", "(lane % 16) * 16 + (lane // 16) * 16",
                "16 for 8: lanes 16-31 a row further, lane 31 past the slice")],
    "ch09.4": [("data", "acc[4 * j + q] = d[q]", "acc[4 * j + q] += d[q]",
                "d already holds acc: the running sum added again every step"),
               ("grid", "wide_tile(c, TILE_N)", "wide_tile(c, 8)",
                "tiles counted 8 columns wide: warps overlap and the wrapper's warps stop short"),
               ("waste", "TILE_N = 32", "TILE_N = 8", "one mma a step: the A fragment loaded again for every 8 columns"),
               ("point", "for k0 in range(0, K, 16):", "for k0 in range(0, K - 15, 16):",
                "whole depth steps only: the last K % 16 dropped")],
    "ch10.1": [("grid", "    for n in range(cuda.grid(1), B * H, cuda.gridsize(1)):\n", "    n = cuda.grid(1)\n    if n < B * H:\n",
                "no grid-stride loop: the wrapper's 4 blocks cover 512 cells"),
               ("point", "b, j = n // H, n % H", "b, j = n // B, n % B", "B for H: right only when B == H"),
               ("data", "z_g = x_terms[b, 2 * H + j] + h_terms[b, 2 * H + j] + bias[2 * H + j]\n"
                        "        z_o = x_terms[b, 3 * H + j] + h_terms[b, 3 * H + j] + bias[3 * H + j]",
                "z_g = x_terms[b, 3 * H + j] + h_terms[b, 3 * H + j] + bias[3 * H + j]\n"
                "        z_o = x_terms[b, 2 * H + j] + h_terms[b, 2 * H + j] + bias[2 * H + j]",
                "gates in i, f, o, g order: g and o swapped"),
               ("grid", "range(cuda.grid(1), B * H, cuda.gridsize(1))", "range(cuda.grid(1), B * H, 512)",
                "the wrapper's 4 x 128 threads hard-coded as the stride")],
    "ch10.2": [("point", "return out.reshape(T, B, four_h)", "return out.reshape(T, B, 4 * I)",
                "4I for 4H: right only when the hidden size equals the input size"),
               ("waste", "return out.reshape(T, B, four_h)",
                "return gemm(x.reshape(T * B, I), w_ih_t, out).reshape(T, B, four_h)", "the projection computed twice"),
               ("data", "return out.reshape(T, B, four_h)", "return out",
                "the (T*B, 4H) buffer returned unviewed: out[t] is row t, not step t")],
    "ch10.3": [("order", "grid.sync()  # every thread has read h_{t-1}: now h may change",
                "cuda.syncthreads()  # every thread has read h_{t-1}: now h may change",
                "a block barrier where the grid's is needed: other blocks may still read h_{t-1}"),
               ("order", "grid.sync()  # every h_t[i] written before the next step reads them",
                "cuda.syncthreads()  # every h_t[i] written before the next step reads them",
                "a block barrier before the next step: other blocks' h_t may not be written yet"),
               ("point", "    for t in range(x.shape[0]):\n", "    if i >= n:\n        return\n    for t in range(x.shape[0]):\n",
                "spare threads leave before the grid barriers: hangs a GPU unless n is a multiple of 32")],
    "ch11.1": [("grid", "    for q in range(cuda.grid(1), queries.shape[0], cuda.gridsize(1)):\n",
                "    q = cuda.grid(1)\n    if q < queries.shape[0]:\n", "no grid-stride loop: the wrapper's 4 blocks cover 256"),
               ("point", "if key != EMPTY:", "if True:",
                "EMPTY queried as a key: it 'finds' the first empty slot and returns whatever value sits there"),
               ("index", "slot = (slot + 1) & mask", "slot = slot + 1", "no wrap: a probe past the last slot reads past the table"),
               ("data", "key = queries[q]", "key = np.int32(queries[q])", "the 64-bit key truncated to 32 bits")],
    "ch11.2": [("order", "at = cuda.atomic.add(counts, k, 1)  # this pair's place: no other thread gets it",
                "cuda.atomic.add(counts, k, 1)\n                at = counts[k] - 1",
                "the place read back after the add: another thread's add may come between"),
               ("order", "at = cuda.atomic.add(counts, k, 1)  # this pair's place: no other thread gets it",
                "at = counts[k]\n                cuda.atomic.add(counts, k, 1)",
                "the place read before the add: two threads may read the same count"),
               ("index", "at = cuda.atomic.add(counts, k, 1)", "at = cuda.atomic.add(counts, k, 1) - 1",
                "the add taken to return the new count: place -1 for the first pair")],
    "ch11.3": [("order", "cuda.atomic.add(out, (rule_out[k, p], c), products[k, p, c])",
                "cuda.atomic.exch(out, (rule_out[k, p], c), out[rule_out[k, p], c] + products[k, p, c])",
                "an atomic exchange of a plainly read sum: the read still races"),
               ("data", "(rule_out[k, p], c)", "(p, c)", "the pair's number for its output row")],
}


def _edits(sets, chapters, exercises):
    """(trial, exercise, [(number, class, old, new, why, edited solutions text)]) per exercise;
    raises before any grading if an edit does not apply (old must occur once in the region)."""
    out = []
    for tag, answers in sets:
        for exercise_id, edits in answers.items():
            if chapters and exercise_id[:4] not in chapters:
                continue
            exercise = exercises[exercise_id]
            text = ex.module_path(exercise.chapter, "solutions").read_text()
            (region,) = [r for r in ex.regions(text) if r.id == exercise_id]
            applied = []
            for number, (kind, old, new, why) in enumerate(edits):
                if kind not in CLASSES:
                    raise ValueError(f"{exercise_id}: unknown class {kind!r}")
                if region.code.count(old) != 1:
                    raise ValueError(f"{exercise_id}: {old!r} must occur once in the reference answer")
                applied.append((number, kind, old, new, why,
                                ex.replace_region(text, exercise_id, region.code.replace(old, new))))
            out.append((tag, exercise, applied))
    return out


def trial(chapters=(), fresh_only=False):
    rows = []
    exercises = {e.id: e for e in ex.all_exercises()}
    sets = [("fresh", FRESH)] if fresh_only else [("first", ANSWERS), ("fresh", FRESH)]
    planned = _edits(sets, chapters, exercises)
    with tempfile.TemporaryDirectory() as directory:
        for tag, exercise, applied in planned:
            exercise_id = exercise.id
            for number, kind, old, new, why, edited in applied:
                module = ex.load_source(edited, Path(directory), f"{exercise_id.replace('.', '_')}_{tag}{number}")
                started = time.perf_counter()
                result = ex.evaluate(exercise, module)
                rows.append({"exercise": exercise_id, "trial": tag, "class": kind, "answer": why, "edit": [old, new],
                             "graded": result.status, "passed": result.passed, "seconds":
                             round(time.perf_counter() - started, 1), "message": (result.message or "")[:300]})
                expected = result.status == ex.SLOW if kind == "waste" else not result.passed
                print(f"{exercise_id} {tag:5s} {kind:5s} {why[:46]:46s} -> {result.status:16s} "
                      f"{'' if expected else '<- escaped'} {rows[-1]['seconds']:5.1f} s  "
                      f"{(result.message or '').splitlines()[0][:90] if result.message else ''}", flush=True)
    return rows


def _summary(rows, label):
    wrong = [r for r in rows if r["class"] != "waste"]
    waste = [r for r in rows if r["class"] == "waste"]
    caught = sum(not r["passed"] for r in wrong)
    return (f"{label}: {caught} of {len(wrong)} wrong answers graded wrong; "
            f"{sum(r['graded'] == ex.SLOW for r in waste)} of {len(waste)} wasteful ones too slow")


def main():
    chapters = [a for a in sys.argv[1:] if a.startswith("ch")]
    fresh_only = "--fresh" in sys.argv
    started = time.perf_counter()
    rows = trial(chapters, fresh_only)
    for tag in ("first", "fresh"):
        mine = [r for r in rows if r["trial"] == tag]
        if mine:
            print(_summary(mine, tag))
    print(f"{len(rows)} answers graded in {time.perf_counter() - started:.0f} s")
    if "--store" in sys.argv:
        target = ROOT / "results" / "wrong_answer_trial.json"
        target.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")
        print(f"stored {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
