"""Chapter 05's kernels: merging two 8-bit images and a 3x3 blur, written four ways.

    directive      @vectorize(target="cuda") called on host arrays: numba writes the kernel and moves
                   the data, at every call (OpenACC's `parallel loop` with implicit copyin/copyout)
    explicit       @cuda.jit launched on host arrays: our kernel, numba's (implicit) transfers
    data region    device arrays made once, several kernels, one copy back (OpenACC's `data`)
    pipelined      row blocks on several streams, pinned host memory (OpenACC's `async` queues)

Every kernel and wrapper here is what the chapter shows and what tests/test_ch05_directives.py tests.
The pipeline and timeline machinery lives in pipeline.py.

Pixel rules (the NumPy references below are the definition):
    merge:  out = (a + b + 1) >> 1        the mean, halves rounded up: (3, 4) -> 4, (0, 255) -> 128
    blur:   out = (sum of the 3x3 neighbourhood + 4) // 9,   the mean rounded to nearest;
            outside the image the edge pixel is repeated (clamp-to-edge), so a 1x1 image blurs to itself.
"""


import numpy as np
from numba import cuda, uint8, vectorize

from workbook import ON_GPU
from workbook.host import by_rows
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, TensorCalls, cdiv

THREADS_PER_BLOCK = 256  # 1-D kernels (merge)
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads, the most a Hopper SM holds at once

# 2-D blocks for the blur: 32 columns x 8 rows = 256 threads. A warp is one row of 32 pixels, so its
# loads and stores touch 32 consecutive bytes: one 32-byte sector each.
BLOCK_X = 32
BLOCK_Y = 8
# The shared-memory blur: each thread produces ROWS_PER_THREAD pixels of one column, so a block
# produces a TILE_X x TILE_Y tile and stages the (TILE_Y + 2) x (TILE_X + 2) input around it.
ROWS_PER_THREAD = 8
TILE_X = BLOCK_X
TILE_Y = BLOCK_Y * ROWS_PER_THREAD  # 64
HALO_X = TILE_X + 2  # 34 bytes per staged row
HALO_Y = TILE_Y + 2  # 66 staged rows: 2244 bytes of shared memory per block

# ---------------------------------------------------------------------------------------------
# References


def merge_reference(a, b):
    return ((a.astype(np.int32) + b + 1) >> 1).astype(np.uint8)


def blur_reference(image):
    """3x3 box blur, clamp-to-edge, rounded to nearest: the definition the kernels must match."""
    padded = np.pad(image.astype(np.int32), 1, mode="edge")
    height, width = image.shape
    total = sum(padded[dy:dy + height, dx:dx + width] for dy in range(3) for dx in range(3))
    return ((total + 4) // 9).astype(np.uint8)


def merge_blur_reference(a, b):
    return blur_reference(merge_reference(a, b))


@by_rows  # pixel by pixel: on every core for a GPU's 64 MP (workbook/host.py), the same bytes
def merge_sequence_reference(a, b, steps):
    """`steps` merges in a row, acc <- merge(acc, b): each step moves the image halfway towards b."""
    acc = a
    for _ in range(steps):
        acc = merge_reference(acc, b)
    return acc


# ---------------------------------------------------------------------------------------------
# The pixel rule, written once. The directive version turns it into a ufunc; the explicit kernels
# call it as a device function. int32 first: uint8 + uint8 would wrap at 256.


def merge_pixel_py(a, b):
    return (np.int32(a) + np.int32(b) + np.int32(1)) >> np.int32(1)


merge_pixel = cuda.jit(device=True)(merge_pixel_py)

# 1. The directive: "apply this to every element, on the GPU". numba generates the kernel, and when
# the arguments are host arrays it copies them to the device, launches, and copies the result back,
# at every call: 2 bytes up and 1 byte down per pixel.
#
# numba's simulator cannot build CUDA ufuncs (vectorize(target="cuda") fails there with
# "'FakeOverload' object has no attribute 'signature'"), so in simulator mode, and only there, the
# same pixel rule is compiled for the CPU: the answers are the same, the data movement is not.
if ON_GPU:
    DIRECTIVE_TARGET = "cuda"
else:
    DIRECTIVE_TARGET = "cpu (simulator fallback)"
merge_ufunc = vectorize(["uint8(uint8, uint8)"], target="cuda" if ON_GPU else "cpu")(merge_pixel_py)


# ---------------------------------------------------------------------------------------------
# 2./3. Explicit kernels.
#
# merge: a grid sized to the machine striding over the flattened image; per pixel it reads 2 bytes
# and writes 1.


@cuda.jit
def merge_kernel(a, b, out):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = merge_pixel(a[i], b[i])  # read 2 bytes, write 1


# blur, "collapse(2)": one thread per output pixel on a 2-D grid, x across columns (so a warp's 32
# lanes read and write 32 consecutive bytes), y down the rows.
#
#     grid:   blockIdx.x -> 32-column strip, blockIdx.y -> 8-row strip
#     thread (x, r) reads src rows r-1, r, r+1 at columns x-1, x, x+1 (9 loads, mostly L1 hits:
#     each byte is loaded by 9 threads) and writes dst[r, x]. DRAM sees ~1 byte in, 1 byte out.
#
# src may be a block of rows of a taller image (the pipeline works on row blocks): it holds image
# rows src_row0 .. src_row0 + src.shape[0] - 1, dst holds image rows dst_row0 ..; the wrapper makes
# src hold one row of halo above and below dst wherever the image has one, so clamping the row to
# what src holds is clamping to the image edge.


@cuda.jit
def blur_2d_kernel(src, dst, src_row0, dst_row0):
    x, r = cuda.grid(2)
    height, width = dst.shape
    if x >= width or r >= height:
        return
    first, last = src_row0, src_row0 + src.shape[0] - 1  # image rows src holds
    y = dst_row0 + r  # this pixel's image row
    up = max(y - 1, first) - src_row0
    mid = y - src_row0
    down = min(y + 1, last) - src_row0
    left = max(x - 1, 0)
    right = min(x + 1, width - 1)
    total = (np.int32(src[up, left]) + np.int32(src[up, x]) + np.int32(src[up, right])
             + np.int32(src[mid, left]) + np.int32(src[mid, x]) + np.int32(src[mid, right])
             + np.int32(src[down, left]) + np.int32(src[down, x]) + np.int32(src[down, right]))
    dst[r, x] = (total + np.int32(4)) // np.int32(9)


# blur, "tile": the block stages its input, halo included, in shared memory once, and each thread
# slides down a column of ROWS_PER_THREAD outputs keeping the horizontal sums of the last rows in
# registers:
#
#     tile (66 x 34 bytes):  row 0 = image row above the block's first output row (the halo)
#                            col 0 = image column left of the block's first output column
#     staging: thread (tx, ty) loads tile rows ty, ty+8, ..., ty+56 of column tx (the body, 8 loads)
#              and at most one byte of the halo's 2 extra rows and 2 extra columns (196 bytes)
#     compute: thread (tx, ty) owns output rows 8*ty .. 8*ty+7 of column tx; output row k uses
#              tile rows k, k+1, k+2; h(j) = tile[j, tx] + tile[j, tx+1] + tile[j, tx+2];
#              out(k) = h(k) + h(k+1) + h(k+2)
#
# Global traffic: (66 x 34) / (64 x 32) = 1.10 loads per output instead of 9 (L1) loads; shared:
# 3 loads per new row, 30 for 8 outputs. Lanes read consecutive bytes: no bank conflicts.
# All of a thread's global loads are issued before its first shared store: a store through a
# generic pointer could alias the global array, so a load after it would wait for it.


@cuda.jit
def blur_tile_kernel(src, dst, src_row0, dst_row0):
    tile = cuda.shared.array((HALO_Y, HALO_X), dtype=uint8)
    body = cuda.local.array(ROWS_PER_THREAD, dtype=uint8)  # registers: indexed by unrolled constants
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    height, width = dst.shape
    last_row, last_col = src.shape[0] - 1, width - 1
    x0 = cuda.blockIdx.x * TILE_X  # first output column of the block
    r0 = cuda.blockIdx.y * TILE_Y  # first output row of the block (in dst)
    top = dst_row0 + r0 - 1 - src_row0  # src row of tile row 0
    left = x0 - 1  # image column of tile column 0
    # Stage. Rows and columns past the image are clamped (so the edge pixel repeats; for a partial
    # tile at the bottom, staged rows past the end are clamped copies that no output uses).
    col = min(max(left + tx, 0), last_col)
    for q in range(ROWS_PER_THREAD):
        body[q] = src[min(max(top + ty + BLOCK_Y * q, 0), last_row), col]
    t = ty * BLOCK_X + tx  # 0..255: who loads which halo byte
    extra_row, extra_col = -1, 0
    if t < 2 * TILE_X:  # the 2 rows below the body, 32 columns
        extra_row, extra_col = TILE_Y + t // TILE_X, t % TILE_X
    elif t < 2 * TILE_X + 2 * HALO_Y:  # the 2 columns right of the body, all 66 rows
        u = t - 2 * TILE_X
        extra_row, extra_col = u // 2, TILE_X + u % 2
    extra = uint8(0)
    if extra_row >= 0:
        extra = src[min(max(top + extra_row, 0), last_row), min(max(left + extra_col, 0), last_col)]
    for q in range(ROWS_PER_THREAD):
        tile[ty + BLOCK_Y * q, tx] = body[q]
    if extra_row >= 0:
        tile[extra_row, extra_col] = extra
    cuda.syncthreads()
    x = x0 + tx
    if x >= width:
        return
    base = ty * ROWS_PER_THREAD
    h0 = np.int32(tile[base, tx]) + np.int32(tile[base, tx + 1]) + np.int32(tile[base, tx + 2])
    h1 = np.int32(tile[base + 1, tx]) + np.int32(tile[base + 1, tx + 1]) + np.int32(tile[base + 1, tx + 2])
    for k in range(ROWS_PER_THREAD):
        j = base + k + 2
        h2 = np.int32(tile[j, tx]) + np.int32(tile[j, tx + 1]) + np.int32(tile[j, tx + 2])
        r = r0 + base + k
        if r < height:
            dst[r, x] = (h0 + h1 + h2 + np.int32(4)) // np.int32(9)
        h0, h1 = h1, h2


# ---------------------------------------------------------------------------------------------
# Launch arithmetic


def merge_blocks(n):
    # Enough blocks to fill every SM, never more than the data needs.
    return max(1, min(sm_count() * BLOCKS_PER_SM, cdiv(n, THREADS_PER_BLOCK)))


def blur_grid(height, width, tiled):
    rows_per_block = TILE_Y if tiled else BLOCK_Y
    return (max(1, cdiv(width, BLOCK_X)), max(1, cdiv(height, rows_per_block)))


BLUR_KERNELS = {"2d": blur_2d_kernel, "tile": blur_tile_kernel}

# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, size the grid, launch. Launches on device arrays go through a
# cache of prepared launches: the same buffers again cost the driver's launch, not numba's typing
# and packing of every argument (chapter 07).

_launches = LaunchCache()
_torch_calls = TensorCalls()  # merge on torch tensors met before: one launch (chapter 07)


def check_image(array, name, *, device=True, like=None):
    if like is None:
        array = require(array, name, dtype=np.uint8, ndim=2, device=device)
        if array.shape[0] < 1 or array.shape[1] < 1:
            raise ValueError(f"{name} is an empty image {tuple(array.shape)}; need at least 1x1 pixels")
        return array
    return require(array, name, dtype=np.uint8, shape=like.shape, device=device)


def merge_directive(a, b):
    """1. The directive: the ufunc on host arrays; numba moves a and b up and the result down."""
    a = check_image(a, "a", device=False)
    b = check_image(b, "b", device=False, like=a)
    return merge_ufunc(a, b)


def merge_on_host_arrays(a, b, out):
    """2. Our kernel launched on host arrays: numba copies every array argument to the device before
    the launch and every one back after it (it cannot know that a and b were only read): 3 bytes up
    and 3 bytes down per pixel."""
    a = check_image(a, "a", device=False)
    b = check_image(b, "b", device=False, like=a)
    out = check_image(out, "out", device=False, like=a)
    merge_kernel[merge_blocks(a.size), THREADS_PER_BLOCK](a.reshape(-1), b.reshape(-1), out.reshape(-1))
    return out


def merge(a, b, out, stream=0):
    """3. Our kernel on device arrays: no transfer at all."""
    given = (a, b, out)
    key = _torch_calls.key(("a", "b", "out"), given, stream)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launch
        return found(None, given)[0]
    a = check_image(a, "a")
    b = check_image(b, "b", like=a)
    out = check_image(out, "out", like=a)
    entry = _launches.launch(merge_kernel, merge_blocks(a.size), THREADS_PER_BLOCK,
                             (a.reshape(a.size), b.reshape(b.size), out.reshape(out.size)), stream=stream)
    _torch_calls.keep(key, entry, returns=(out,), owners=(2,))
    return out


def blur(src, dst, variant="2d", stream=0, *, src_row0=0, dst_row0=0, image_height=None):
    """Blur src into dst on the device with the "2d" (one pixel per thread) or "tile" kernel.

    Whole image: blur(src, dst). A block of rows of a taller image: dst holds image rows
    dst_row0 .. dst_row0 + dst.shape[0] - 1 and src must hold exactly those rows plus one more above
    and below wherever the image (of image_height rows) has them.
    """
    if variant not in BLUR_KERNELS:
        raise ValueError(f"variant must be one of {sorted(BLUR_KERNELS)}, not {variant!r}")
    src = check_image(src, "src")
    dst = check_image(dst, "dst")
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"src and dst must have the same width, not {src.shape[1]} and {dst.shape[1]}")
    height = dst.shape[0] if image_height is None else image_height
    want_first = max(dst_row0 - 1, 0)
    want_last = min(dst_row0 + dst.shape[0], height - 1)
    if dst_row0 < 0 or dst_row0 + dst.shape[0] > height or (src_row0, src.shape[0]) != (
            want_first, want_last - want_first + 1):
        raise ValueError(f"src must hold image rows {want_first}..{want_last} for dst rows {dst_row0}.."
                         f"{dst_row0 + dst.shape[0] - 1} of a {height}-row image; it holds "
                         f"{src_row0}..{src_row0 + src.shape[0] - 1}")
    grid = blur_grid(dst.shape[0], dst.shape[1], variant == "tile")
    _launches.launch(BLUR_KERNELS[variant], grid, (BLOCK_X, BLOCK_Y), (src, dst), (src_row0, dst_row0), stream=stream)
    return dst


def merge_blur(a, b, merged, out, variant="2d", stream=0):
    """Merge then blur, all on the device: two kernels, no round trip between them."""
    merge(a, b, merged, stream)
    return blur(merged, out, variant, stream)
