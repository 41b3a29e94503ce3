"""What the tensor cores are, as numbers: the instructions' shapes, which lane holds which element
of a fragment, TF32's and BF16's rounding, the 128-byte swizzle and wgmma's matrix descriptors.

Pure NumPy and arithmetic, imported by both sides: the instructions (tensor_cores.py, which
re-exports every name here) and the simulator's model of them (simulator/collectives.py,
simulator/tensor_ops.py), so that neither imports the other for a fact.
"""

import numpy as np

TF32_MASK = 0xFFFFE000  # the bits of a float32 that a TF32 keeps: sign, 8 exponent, 10 mantissa


def round_tf32(x):
    """NumPy model of cvt.rna.tf32.f32 on a float32 array: round to 10 mantissa bits, ties away
    from zero; NaN and Inf unchanged (host side, for references and tests)."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x1000) & TF32_MASK).astype(np.uint32)
    return np.where(np.isfinite(x), rounded.view(np.float32), x)


def truncate_tf32(x):
    """What mma_tf32 makes of a float32 that was not rounded first: the low 13 bits dropped."""
    x = np.asarray(x, np.float32)
    return (x.view(np.uint32) & np.uint32(TF32_MASK)).view(np.float32)


def to_bf16(x):
    """float32 values as BF16's bits (uint16): cvt.rn.bf16x2.f32's rounding, to nearest, ties to
    even; a NaN stays a NaN. NumPy has no bfloat16: the workbook keeps BF16 data as these bits."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(x), ((bits >> 16) | 0x40).astype(np.uint16), rounded)


def from_bf16(bits):
    """BF16's bits (uint16) as the float32 values they are."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


def fragment_coordinates(kind):
    """{"a": [(row, col) per register] per lane, "b": ..., "c": ...} for "tf32" (m16n8k8) or "f16"
    (m16n8k16; a register of A or B holds the element at (row, col) and the next column (A) or row
    (B) of the pair). Arrays of shape (32, registers, 2)."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    if kind == "tf32":
        a = [(g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)]
        b = [(t, g), (t + 4, g)]
    elif kind in ("f16", "bf16"):
        a = [(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]
        b = [(2 * t, g), (2 * t + 8, g)]
    else:
        raise ValueError(f"fragment_coordinates: kind must be 'tf32', 'f16' or 'bf16', not {kind!r}")
    c = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
    return {name: np.stack([np.stack(pair, axis=-1) for pair in regs], axis=1) for name, regs in
            (("a", a), ("b", b), ("c", c))}


MMA_SHAPES = {"tf32": (16, 8, 8), "f16": (16, 8, 16), "bf16": (16, 8, 16)}  # (M, N, K)
WGMMA_SHAPES = {"tf32": (64, 128, 8), "f16": (64, 128, 16)}  # (M, N, K): 32 bytes of depth either way
WGMMA_ACCUMULATORS = 64  # a thread's share of the 64 x 128 tile
SWIZZLE_ROW, SWIZZLE_ATOM = 128, 1024  # bytes: a row of the 128-byte swizzle, 8 rows of it


def swizzle128(address):
    """Where the 128-byte swizzle puts a byte address: its 16-byte unit (bits 4-6) XOR its row within
    the 1024-byte atom (bits 7-9)."""
    return address ^ (((address >> 7) & 7) << 4)


def shared_descriptor(address, stride=SWIZZLE_ATOM):
    """wgmma's 64-bit matrix descriptor of a K-major tile in the 128-byte swizzle starting at `address`
    (bytes, shared memory): start >> 4 in bits 0-13, leading offset (unused by this layout, 1) in
    16-29, stride to the next 8 rows >> 4 in 32-45, base offset 0, layout type 1 in bits 62-63."""
    address = int(address)  # a uint32 from shared_address; a kernel compiles this function too
    return ((address >> 4) & 0x3FFF) | (1 << 16) | ((stride >> 4) << 32) | (1 << 62)


def n_major_descriptor(address, panel_stride):
    """wgmma's descriptor of an N-major B (its rows are K, each 64 halves of N in the 128-byte
    swizzle, as a K-major tile's are): start >> 4; leading offset = `panel_stride`, the bytes from
    one 64-wide panel of N to the next; stride 1024, from 8 rows of K to the next 8; layout type 1.
    The instruction reads it with imm-trans-b = 1 (CUTLASS's canonical "MN-major SW128" layout)."""
    address = int(address)
    return ((address >> 4) & 0x3FFF) | ((panel_stride >> 4) << 16) | ((SWIZZLE_ATOM >> 4) << 32) | (1 << 62)


def decode_descriptor(descriptor):
    """A descriptor's fields, in bytes where they are addresses or offsets."""
    descriptor = int(descriptor)
    return {"start": (descriptor & 0x3FFF) << 4, "leading": ((descriptor >> 16) & 0x3FFF) << 4,
            "stride": ((descriptor >> 32) & 0x3FFF) << 4, "base_offset": (descriptor >> 49) & 7,
            "layout": descriptor >> 62}


def wgmma_coordinates():
    """(128, 64, 2) array: for thread t of a warpgroup and accumulator i, the (row, column) of the 64 x
    128 tile it holds."""
    out = np.zeros((128, WGMMA_ACCUMULATORS, 2), int)
    for tid in range(128):
        w, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        for i in range(WGMMA_ACCUMULATORS):
            j, q = i // 4, i % 4
            out[tid, i] = (16 * w + g + 8 * (q // 2), 8 * j + 2 * t + q % 2)
    return out
