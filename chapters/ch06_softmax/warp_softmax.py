"""Chapter 06's register kernel: softmax with a warp per row and the whole row in registers,
written out unrolled for each number of columns per lane."""

import linecache
import math  # noqa: F401  (this and the other unused-looking names: the generated source uses them)
from functools import lru_cache

import numpy as np  # noqa: F401
from numba import cuda

from workbook.memory import load16, store16  # noqa: F401

from .common import NEG_INF, ONE, WARP, warp_max, warp_sum  # noqa: F401

# The register kernel. numba has no `#pragma unroll`, and a loop of 16 or 32 exps is too long for
# the compiler to unroll completely (LLVM's NVPTX pipeline, tried offline, leaves it rolled), so a
# `cuda.local.array` indexed in it would end up in (slow) local memory. The kernel is therefore
# written out unrolled, once per `slots` (columns per lane), from this template: slots = 2 gives
# the body with v0, v1 that `workbook.show(warp_softmax_kernel(2))` prints.

_WARP_SOFTMAX_SOURCE = """
def {name}(x, out):
    # A warp per row; {layout}
    lane = cuda.threadIdx.x % WARP
    first_row = cuda.grid(1) // WARP
    row_step = cuda.gridsize(1) // WARP
    ncols = x.shape[1]
    for row in range(first_row, x.shape[0], row_step):  # warp-uniform: all lanes, same rows
        # {in_flight}
{loads}
        top = warp_max({max_of_all})
{exps}
        inv = ONE / warp_sum({sum_of_all})
{stores}
"""


def _tree(op, names):
    """A balanced expression: max(max(a, b), max(c, d)), (a + b) + (c + d): short dependency chains."""
    if len(names) == 1:
        return names[0]
    half = len(names) // 2
    left, right = _tree(op, names[:half]), _tree(op, names[half:])
    return f"max({left}, {right})" if op == "max" else f"({left} + {right})"


def warp_softmax_kernel(slots, full=False, width=1):
    """See _warp_softmax_kernel: one compiled kernel per (slots, full, width)."""
    return _warp_softmax_kernel(int(slots), bool(full), int(width))


@lru_cache(maxsize=None)
def _warp_softmax_kernel(slots, full, width):
    """Softmax with a warp per row and the row in registers (OneFlow's design for rows up to 1024
    columns): read and write each byte once, 8*C bytes per row in float32.

    full=True: for rows of exactly 32*slots columns, with no bounds checks at all. The checks are
    not free: 2*slots comparisons, and every load and store predicated (on the H100, 1000-column
    rows run well below 1024-column ones: see the chapter's sweep).

    width=4 (float32) or 8 (float16): the lane's values come in 16-byte loads of `width` columns
    (load16) and go out in 16-byte stores: slots/width accesses per lane instead of 2*slots. Lane l
    holds columns width*l .. width*l + width-1, then the same 32*width columns further, and so on.
    Needs slots >= width, rows a multiple of `width` columns and 16-byte aligned arrays.
    """
    pad = " " * 8
    names = [f"v{j}" for j in range(slots)]

    def col(j):
        return "lane" if j == 0 else f"lane + {j * WARP}"

    if width > 1:
        loads, stores = _wide_register_body(slots, full, width, pad)
    elif full:
        loads = [f"{pad}v{j} = np.float32(x[row, {col(j)}])" for j in range(slots)]
        stores = [f"{pad}out[row, {col(j)}] = v{j} * inv" for j in range(slots)]
    else:
        loads = [f"{pad}v{j} = np.float32(x[row, {col(j)}]) if {col(j)} < ncols else NEG_INF"
                 for j in range(slots)]
        stores = [f"{pad}if {col(j)} < ncols:\n{pad}    out[row, {col(j)}] = v{j} * inv" for j in range(slots)]
    name = f"warp_softmax_{slots}" + ("_full" if full else "") + (f"_x{width}" if width > 1 else "")
    if width == 1:
        layout = f"lane l holds columns l, l+32, ..., l+32*{slots - 1} in v0..v{slots - 1}."
        in_flight = (f"{slots} independent loads per lane, all in flight at once. Each address is the row's\n"
                     f"{pad}# start + 4*lane + 128*j bytes: one base register and a constant offset per load.")
    else:
        layout = (f"lane l holds columns {width}l..{width}l+{width - 1}, the same {WARP * width} columns "
                  f"further, ... in v0..v{slots - 1}.")
        in_flight = (f"{slots // width} independent 16-byte loads per lane, all in flight at once, at the "
                     f"row's start\n{pad}# + 16*lane + 512*k bytes: a warp reads 512 contiguous bytes per load.")
    source = _WARP_SOFTMAX_SOURCE.format(
        name=name, layout=layout, in_flight=in_flight, loads="\n".join(loads), max_of_all=_tree("max", names),
        exps="\n".join(f"{pad}v{j} = math.exp(v{j} - top)" for j in range(slots)),
        sum_of_all=_tree("+", names), stores="\n".join(stores))
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for show()
    namespace = dict(globals())
    exec(compile(source, filename, "exec"), namespace)
    return cuda.jit(namespace[name])


def _wide_register_body(slots, full, width, pad):
    """The loads and stores of the 16-byte register kernel: access k of a lane covers columns
    width*lane + 32*width*k ... + width-1 (flat index `start` + 32*width*k), values v[width*k ...]."""
    loads = [f"{pad}start = row * ncols + {width} * lane  # this lane's first column, as a flat index"]
    stores = []
    for k in range(slots // width):
        values = [f"v{k * width + e}" for e in range(width)]
        offset = "" if k == 0 else f" + {k * WARP * width}"
        # float32 arrives as float32; float16 arrives as 8 halves (h...), converted for the arithmetic
        if width == 4:
            load = [f"{', '.join(values)} = load16(x, start{offset})"]
        else:
            halves = [f"h{k * width + e}" for e in range(width)]
            load = [f"{', '.join(halves)} = load16(x, start{offset})"] + [
                f"{v} = np.float32({h})" for v, h in zip(values, halves)]
        store = f"store16(out, start{offset}, ({', '.join(v + ' * inv' for v in values)}))"
        if full:
            loads += [pad + line for line in load]
            stores.append(pad + store)
        else:  # ncols % width == 0: a lane's access is all inside the row or all past it
            inside = f"{width} * lane{offset} < ncols"
            loads.append(f"{pad}if {inside}:")
            loads += [pad + "    " + line for line in load]
            loads += [f"{pad}else:", f"{pad}    {' = '.join(values)} = NEG_INF"]
            stores += [f"{pad}if {inside}:", f"{pad}    {store}"]
    return loads, stores


def _slots(ncols):
    """Columns per lane for the register kernel, rounded up to a power of two (1, 2, ..., 32): a
    handful of compiled variants, as OneFlow's template parameter has."""
    slots = 1
    while slots * WARP < ncols:
        slots *= 2
    return slots

