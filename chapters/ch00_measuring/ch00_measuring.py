# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 00 — Measuring a kernel
#
# In this chapter you will learn
# - how the workbook checks a kernel against NumPy and times it (CUDA events, warm-up, median of
#   many interleaved runs, bytes counted, the copy ceiling measured in the same run), and why the
#   GPU time of a call and what the call costs the host are two figures, measured apart;
# - the one idea every later chapter rests on: **memory coalescing** — a warp's 32 loads should
#   fall on consecutive addresses;
# - why a grid sized to the machine, with several independent loads in flight per thread, beats a
#   grid with one element per thread, and what "wider loads" buy on top;
# - how to reach an instruction numba does not expose — the 16-byte load `ld.global.v4.f32` —
#   through an *intrinsic* (`workbook/memory.py`), and how to read the PTX to see that you got it.
#
# Every chapter has the same skeleton: NumPy reference → naive kernel → optimized kernel → check →
# benchmark (sweep + plot) → what the numbers mean → exercises.
#
# Without a GPU, this notebook runs in numba's CUDA simulator: every kernel runs and is checked, on
# small arrays; the times printed there mean nothing, so each comparison is followed by the stored
# figures of the reference GPU.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, host, plots

from chapters.ch00_measuring import in_flight
from chapters.ch00_measuring import kernels as k

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch00", "Measuring a kernel: coalescing")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The kernels
#
# The naive copy gives each thread one element. Its loads are already coalesced — lane *k* reads
# word *k* — but each thread has exactly one load to wait for, ~600 ns, before it can store and
# exit.

# %%
workbook.show(k.copy_one_per_thread_kernel)

# %% [markdown]
# The optimized copy launches only as many blocks as the GPU holds at once (8 blocks of 256 threads
# per SM, 132 SMs on a Hopper GPU) and lets each thread stride over the array by the grid size, with four
# independent loads issued before the first store:

# %%
workbook.show(k.copy_grid_stride_kernel)

# %% [markdown]
# ## 16 bytes per access: an instruction numba does not expose
#
# `src[i]` on a float32 array compiles to a 4-byte load, `ld.global.f32`, and numba has no wider
# one. The GPU has: `ld.global.v4.f32` moves 16 bytes — four floats — in one instruction. Why it
# matters for a kernel that only moves memory:
#
# - **instructions**: a copy of 2^28 floats issues 2^28 loads and 2^28 stores at 4 bytes each, a
#   quarter as many at 16 bytes. Fewer instructions to issue and fewer memory requests to track;
# - **bytes in flight**: HBM has a latency of ~600 ns, so the rate a thread can sustain is the bytes
#   it has *outstanding* divided by that latency. Four 4-byte loads in flight are 16 bytes per thread;
#   four 16-byte loads are 64.
#
# numba lets a kernel call an **intrinsic**: a function whose body is LLVM IR, written when the
# kernel is compiled. `workbook/memory.py` has four: `load4(a, i)` returns `a[i..i+3]` as a tuple,
# `store4(a, i, quad)` writes one, and `shared_load4` / `shared_store4` do the same in shared
# memory. Each takes the array's data pointer, steps to element `i`, casts the pointer to the
# global address space and to a pointer to a `<4 x float>` vector, and loads that vector with
# 16-byte alignment; NVVM turns that into `ld.global.v4.f32`. The rules are the hardware's: `i` a
# multiple of 4 and the array's first element 16-byte aligned (a view `a[1:]` is not), or the GPU
# faults with "misaligned address"; so the kernel moves whole quads 4-wide and the last `n % 4`
# elements one by one, and its wrapper checks `memory.aligned(...)` and takes the 4-byte kernel
# when it is not. In the simulator the same functions run element by element and raise an error
# for a misaligned or out-of-range quad, where a GPU would fault or silently read past the end.

# %%
workbook.show(k.copy_quads_kernel)

# %% [markdown]
# Notice the shape: *one* quad per thread, on a grid sized to the data — not the grid-stride loop
# that won with 4-byte loads. A quad already puts 16 bytes in flight per thread with one load.
# `quad_sweep.py` in this folder times 36 grid-stride shapes (1, 2 or 4 quads in flight, 128-512
# threads, 2-32 blocks per SM), each against torch's `copy_`; none of them reached a quad per
# thread on the reference GPU (`results/.../ch00_quad_sweep.log`). torch's copy kernel is a
# data-sized grid too.

# %% [markdown]
# **Did we get the instruction?** Read the PTX, the GPU's assembly language, that numba generates
# for these argument types. `workbook.show_ptx` compiles the kernel with numba's real compiler —
# on a laptop too, with the `compile` extra — and prints the lines that match a pattern. (On a GPU,
# `kernel.inspect_asm(signature)` gives the same text for a kernel already compiled.) One 16-byte
# load and one 16-byte store per thread, then the tail's 4-byte copies:

# %%
_words = np.zeros(8, np.uint32)  # copy_quads copies any 4- or 8-byte dtype as uint32 quads
workbook.show_ptx(k.copy_quads_kernel, _words, _words, grep=r"(ld|st)\.global")

# %% [markdown]
# ## Check first
#
# A kernel is right before it is fast. The sizes that break kernels are the small and the odd
# ones: 1 element, 31 and 33 (one short of and one past a warp), sizes that leave the last block
# partly empty, and a large odd size. The check names the block and thread of the first wrong
# element, if there is one.

# %%
odd_sizes = [1, 31, 33, 1000, 4097, workbook.size(gpu=(1 << 24) + 3, sim=3001)]
for n in odd_sizes:
    src = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    d_src, d_y = cuda.to_device(src), cuda.to_device(y)
    for copy in (k.copy_one_per_thread, k.copy_grid_stride, k.copy_grid_stride_wide, k.copy_quads):
        out = copy(d_src, cuda.device_array_like(d_src))
        workbook.assert_close(out, k.copy_reference(src), exact=True, name=f"{copy.__name__} n={n}")
    for axpy in (k.axpy_one_per_thread, k.axpy_grid_stride, k.axpy_quads):
        out = axpy(2.5, d_src, d_y, cuda.device_array_like(d_src))
        workbook.assert_close(out, k.axpy_reference(2.5, src, y), name=f"{axpy.__name__} n={n}")
print("all kernels agree with NumPy at sizes", odd_sizes)

# %% [markdown]
# ## Copy: naive vs optimized, against the copy ceiling
#
# A copy of *n* float32 reads 4n bytes and writes 4n bytes: **8n bytes**. On a GPU the array is
# 2^26 floats (256 MiB, five times a Hopper GPU's 50 MB L2), so every byte really comes from HBM.
# The ceiling is the driver's device-to-device copy (and torch's, when torch is installed),
# measured in this same process.

# %%
n = workbook.size(gpu=1 << 26, sim=4096)
src = cuda.to_device(host.standard_normal(rng, n))  # rng.standard_normal on every core
dst = cuda.device_array_like(src)
torch_src, torch_dst = workbook.bench.torch_view(src), workbook.bench.torch_view(dst)

copy_result = chapter.compare(
    "copy",
    {
        "one per thread": lambda: k.copy_one_per_thread(src, dst),
        "grid-stride x4": lambda: k.copy_grid_stride(src, dst),
        "grid-stride x4, 8-byte words": lambda: k.copy_grid_stride_wide(src, dst),
        "16-byte quads, a quad per thread": lambda: k.copy_quads(src, dst),
    },
    reference=lambda: src.copy_to_host(),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    baselines={"torch copy_": lambda: torch_dst.copy_(torch_src)},
    bytes=8 * n,
    size=f"n={n:,} float32",
)
chapter.bar("optimized copy (grid-stride x4, 8-byte words): fraction of the copy ceiling, n=2^26",
            copy_result.fraction("grid-stride x4, 8-byte words"), at_least=0.85)

# %% [markdown]
# ## axpy: `out = a*x + y`
#
# Reads 8n bytes, writes 4n: **12n bytes** for 2n FLOPs — 1/6 FLOP per byte, so no GPU can make
# this compute-bound: it is a memory kernel, and its yardstick is the copy ceiling.

# %%
x = src
y = cuda.to_device(host.standard_normal(rng, n))
out = cuda.device_array_like(x)
torch_x, torch_y, torch_out = (workbook.bench.torch_view(a) for a in (x, y, out))

axpy_result = chapter.compare(
    "axpy",
    {
        "one per thread": lambda: k.axpy_one_per_thread(2.5, x, y, out),
        "grid-stride x4": lambda: k.axpy_grid_stride(2.5, x, y, out),
        "grid-stride x2, 16-byte quads": lambda: k.axpy_quads(2.5, x, y, out),
    },
    reference=lambda: k.axpy_reference(2.5, x.copy_to_host(), y.copy_to_host()),
    baselines={"torch add(alpha=)": lambda: __import__("torch").add(torch_y, torch_x, alpha=2.5, out=torch_out)},
    bytes=12 * n,
    flops=2 * n,
    size=f"n={n:,} float32",
)

# %% [markdown]
# ## Coalesced vs strided
#
# `gather_strided` reads every *s*-th element. The useful bytes are the same 4 per element, but
# the memory system moves whole 32-byte sectors: at stride 8 and beyond, each lane's load lands
# in its own sector and 28 of every 32 bytes fetched are thrown away. We count only the useful
# bytes (4 read + 4 written per element), so the GB/s below falls as the stride grows.

# %%
strides = [1, 2, 4, 8, 16, 32]
gather_rates = {}
for stride in strides:
    out = cuda.device_array(n // stride, dtype=np.float32)
    result = chapter.compare(
        f"gather stride {stride}",
        {f"stride {stride}": lambda: k.gather_strided(src, out, stride)},
        reference=lambda: k.gather_reference(src.copy_to_host(), stride),
        bytes=8 * (n // stride),
        size=f"n={n:,} float32",
        show=workbook.ON_GPU,
    )
    gather_rates[stride] = result[f"stride {stride}"].gbps
if workbook.ON_GPU:
    for stride, rate in gather_rates.items():
        print(f"stride {stride:2d}: {rate:7.0f} GB/s of useful bytes")

# %% [markdown]
# ### What each warp's load moves, counted without a GPU
#
# A GPU does not serve threads one at a time: the 32 lanes of a warp issue a load together, and the
# memory system answers that *request* with whole 32-byte sectors. In the simulator, which runs
# every thread, `workbook.memtrace` sees each access, groups the lanes of a warp into requests the
# way the hardware does, and counts the sectors each one moves (Nsight Compute's
# `l1tex__t_sectors_pipe_lsu_mem_global_op_ld` over `..._requests_...`). Below: the gather's sectors
# per request, traced on this machine, beside the useful GB/s the reference GPU measured. Up to
# stride 8 the rate falls as the sectors per load rise, until every lane has a sector of its own.
# Past it the count stays at 32 sectors a request, yet the stored rate still falls from stride 8
# to 16 (the last column): the trace models the L1's sectors, not DRAM, which the numbers suggest is
# read in pairs of sectors (64 bytes) - at stride 8 two lanes share a pair, from stride 16 on each
# needs its own. The three copies move every byte they fetch; the 16-byte quads do it in a quarter of
# the requests. The picture is one warp's load at the last stride: each lane's 4 bytes, and the
# sectors (grey) moved to serve them.

# %%
if workbook.ON_GPU:
    print("memtrace counts in the simulator (WORKBOOK_DEVICE=sim). On a GPU, Nsight Compute reads the counters "
          "it models:\n  ncu --metrics l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,"
          "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum python ch00_measuring.py")
else:
    from rich.table import Table

    from workbook import memtrace, tables

    traced = cuda.to_device(rng.standard_normal(32 * 256, dtype=np.float32))
    table = Table(title="global loads as traced here, beside the reference GPU's useful GB/s", title_justify="left")
    for column in ("kernel", "requests per 1,024 loaded elements", "sectors / request", "bytes used / moved",
                   "stored GB/s"):
        table.add_column(column, justify="right" if column != "kernel" else "left")

    def traced_loads(run):
        with memtrace.trace() as trace:
            run()
        (totals,) = [spaces["global ld"] for spaces in trace.kernels().values()]
        return trace, totals

    for stride in strides:
        trace, loads = traced_loads(lambda: k.gather_strided(
            traced, cuda.device_array(traced.size // stride, np.float32), stride))
        table.add_row(f"gather, stride {stride}", f"{1024 * loads.requests / (loads.requested // 4):.0f}",
                      f"{loads.sectors_per_request:.0f}", f"{loads.efficiency:.0%}",
                      f"{chapter.figure(f'gather stride {stride}', f'stride {stride}', 'gbps'):.0f}")
    gather_picture = trace.draw("gather_strided_kernel")
    for name, copy in (("one per thread", k.copy_one_per_thread), ("grid-stride x4", k.copy_grid_stride),
                       ("16-byte quads, a quad per thread", k.copy_quads)):
        _, loads = traced_loads(lambda: copy(traced, cuda.device_array_like(traced)))
        table.add_row(f"copy, {name}", f"{1024 * loads.requests / (loads.requested // 4):.0f}",
                      f"{loads.sectors_per_request:.0f}", f"{loads.efficiency:.0%}",
                      f"{chapter.figure('copy', name, 'gbps'):.0f}")
    tables.console().print(table)

# %% [markdown]
# ## A size sweep
#
# Two costs, measured apart. CUDA events time what the GPU does between them; but if the GPU is
# idle when the start event is recorded, it waits there for Python to finish the call (checks,
# launch: 30-80 µs in our wrappers, 8-11 µs for a torch op), and the events time that wait too.
# So `compare` holds the GPU before each timed call: a one-thread kernel spins on a flag in host
# memory until the host has queued the whole call (`workbook.bench.held`, nvbench's "blocking
# kernel"). The **median ms** column is then the GPU's time alone; **host us/call** is what a call
# costs the CPU, and **1 call us** one call with its synchronize, what `%timeit` sees. Below ~2^20
# elements the GPU time is a few microseconds while the host's is tens: a loop of such calls is
# launch-bound, whatever the kernel (chapter 07). Arrays that fit in the 50 MB L2 (2^22 floats is
# 16 MiB per buffer) are served from it; only past the L2 do we see the HBM rate. The dashed line
# is the copy ceiling measured in this run.

# %%
sweep_sizes = [1 << p for p in (range(16, 29, 2) if workbook.ON_GPU else range(6, 13, 2))]
sweep_results = {}
series = {"one per thread": [], "grid-stride x4": [], "grid-stride x4, 8-byte words": [],
          "16-byte quads, a quad per thread": [], "torch copy_": []}
for size in sweep_sizes:
    s_src = cuda.to_device(host.standard_normal(rng, size))
    s_dst = cuda.device_array_like(s_src)
    t_src, t_dst = workbook.bench.torch_view(s_src), workbook.bench.torch_view(s_dst)
    result = chapter.compare(
        "copy sweep",
        {
            "one per thread": lambda: k.copy_one_per_thread(s_src, s_dst),
            "grid-stride x4": lambda: k.copy_grid_stride(s_src, s_dst),
            "grid-stride x4, 8-byte words": lambda: k.copy_grid_stride_wide(s_src, s_dst),
            "16-byte quads, a quad per thread": lambda: k.copy_quads(s_src, s_dst),
        },
        reference=lambda: s_src.copy_to_host(),
        baselines={"torch copy_": lambda: t_dst.copy_(t_src)},
        bytes=8 * size,
        size=f"n={size:,}",
        repeats=20,
        show=False,
    )
    for name in series:
        series[name].append(result.gbps(name))
    sweep_results[size] = result

if workbook.ON_GPU:
    chapter.bar("optimized copy (grid-stride x4, 8-byte words): fraction of the copy ceiling, n=2^28",
                sweep_results[1 << 28].fraction("grid-stride x4, 8-byte words"), at_least=0.85)
    chapter.bar("16-byte copy (a quad per thread): fraction of the copy ceiling, n=2^28",
                sweep_results[1 << 28].fraction("16-byte quads, a quad per thread"), at_least=0.9)
    ceiling = workbook.bench.copy_ceiling()["gbps"]
    figure = plots.sweep(sweep_sizes, series, ceiling=ceiling, xlabel="float32 elements",
                         ylabel="GB/s (read + written)", title="Copy bandwidth vs size")
    chapter.savefig(figure, "copy_sweep")
else:
    print("simulator: the sweep ran and was checked at", sweep_sizes, "- the plot needs a GPU's times.")
    chapter.show_stored_figure("copy_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## Bytes in flight: why the same kernel is fast on one GPU and short on the next
#
# Little's law ties three figures together: the rate a memory system delivers is the bytes kept in
# flight divided by the time each request takes, its **latency**. So to move its copy ceiling a GPU
# needs *ceiling x latency* bytes outstanding at every moment, shared by its SMs. Both sides can be
# measured on your GPU:
#
# - **Latency**: one thread follows a chain of dependent loads through a buffer past the L2
#   (`j = chain[j]`): each load waits for the last, so the time per step is the latency.
# - **Bytes in flight**: a grid-stride copy of 16-byte quads with exactly `blocks_per_sm` blocks of
#   256 threads on every SM, each thread with one load outstanding: an SM keeps
#   blocks_per_sm x 256 x 16 bytes in flight.

# %%
workbook.show(in_flight.chase_kernel)
workbook.show(in_flight.in_flight_copy_kernel)

# %%
chain_n = workbook.size(gpu=1 << 26, sim=1 << 10)  # 256 MiB of int32 on a GPU: far past the L2
chain_stride = workbook.size(gpu=(1 << 20) + 4099, sim=97)  # 4 MiB apart: no two steps share a page
chain_steps = workbook.size(gpu=20_000, sim=40)
d_chain, d_end = cuda.to_device(in_flight.chain(chain_n, chain_stride)), cuda.device_array(1, np.int32)
latency_result = chapter.compare(
    "latency", {"dependent loads": lambda: in_flight.chase(d_chain, chain_steps, d_end)},
    reference=in_flight.chase_reference(chain_n, chain_stride, chain_steps),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    size=f"{chain_steps:,} steps through {4 * chain_n >> 20} MiB", repeats=5, show=False,
    flush=True)  # the L2 emptied before each timed call: the same steps again would hit it

flight_blocks = [1, 2, 3, 4, 6, 8]  # s_src, s_dst: the sweep's largest buffers, reused
flight_result = chapter.compare(
    "bytes in flight",
    {f"{blocks} blocks/SM": (lambda blocks=blocks: in_flight.in_flight_copy(s_src, s_dst, blocks))
     for blocks in flight_blocks},
    reference=lambda: s_src.copy_to_host(),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    bytes=8 * s_src.size, size=f"n={s_src.size:,} float32", repeats=10)

if workbook.ON_GPU:
    facts = workbook.results.device_facts()
    ceiling = workbook.bench.copy_ceiling()["gbps"]
    latency_ns = latency_result["dependent loads"].median_ms * 1e6 / chain_steps
    chapter.record("bytes in flight", {
        "latency_ns": latency_ns, "ceiling_gbps": ceiling, "sms": facts["sms"],
        "needed_kb_per_sm": in_flight.needed_per_sm(ceiling, latency_ns, facts["sms"]) / 1024,
        "kb_per_sm": [in_flight.bytes_in_flight_per_sm(blocks) / 1024 for blocks in flight_blocks],
        "fraction_of_ceiling": [flight_result.fraction(f"{blocks} blocks/SM")[0] for blocks in flight_blocks]})
    figure = plots.in_flight(chapter.records["bytes in flight"], facts["name"],
                             others=workbook.results.other_devices("ch00"))
    chapter.savefig(figure, "bytes_in_flight")
else:
    chapter.record("bytes in flight", None)
    chapter.show_stored_figure("bytes_in_flight")

# %% [markdown]
# With few bytes in flight the copy is **latency-bound**: every block added to an SM adds its bytes
# in flight and the rate grows in proportion. The dashed line is what Little's law asks for with the
# latency of one load on an idle GPU; under a full load each request also waits in queues, so the
# rate goes on rising a little past the line and flattens where that longer latency is covered.
# Past it, more in flight buys nothing: the memory is busy. A GPU with more bandwidth and the same
# latency puts the line further right, so a kernel
# that kept just enough in flight on one GPU falls short on the next (the other lines are the
# same need on the other GPUs whose results this workbook stores, from their measured ceilings).
# What moves a kernel right is what this chapter did: more threads resident on each SM, more
# independent loads per thread (the grid-stride loop's four), wider loads (16 bytes), and blocks
# that never stop loading: a block that waits at a barrier before its first load, or ends after a
# few loads, holds nothing in flight meanwhile (chapter 01's fused BatchNorm gives each block
# several planes for that reason).

# %%
figures = chapter.figures_source()["records"].get("bytes in flight")
if figures:
    print(f"latency {figures['latency_ns']:.0f} ns x ceiling {figures['ceiling_gbps']:.0f} GB/s over "
          f"{figures['sms']} SMs: {figures['needed_kb_per_sm']:.1f} KB in flight per SM needed")
    for kb, fraction in zip(figures["kb_per_sm"], figures["fraction_of_ceiling"]):
        print(f"  {kb:5.0f} KB per SM in flight: {fraction:.0%} of the copy ceiling")
else:
    print("(no stored GPU figures for bytes in flight yet: run this chapter on a GPU)")

# %% [markdown]
# ## What the numbers mean
#
# - Both copies are coalesced; the difference is **work in flight**. One element per thread
#   launches n/256 blocks that each live for one load; the grid-stride kernel keeps every SM full
#   for the whole run and has four loads outstanding per thread.
# - **Wider words** move the same bytes with half (8 bytes) or a quarter (16 bytes) of the load and
#   store instructions, and keep more bytes in flight per thread; the 16-byte quads need an
#   intrinsic, since numba exposes no such load, and the PTX shows whether the compiler emitted it.
# - **Strided access** wastes the sector: at stride ≥ 8 each 32-byte sector the memory moves brings
#   one useful float of its eight, so the useful bandwidth falls several-fold, the cost every later
#   chapter avoids.
# - **Bytes in flight** set a copy's rate: Little's law asks for latency x bandwidth bytes in flight
#   on each SM, and a GPU with faster memory asks for more of them.
#
# The figures these bullets point to:

# %%
_copy = "copy"
chapter.show_figures({
    **{f"copy, {name}: of the copy ceiling": ("{:.0%}", lambda v=variant: chapter.figure(_copy, v, "fraction_of_ceiling"))
       for name, variant in (("one per thread", "one per thread"), ("grid-stride x4", "grid-stride x4"),
                             ("8-byte words", "grid-stride x4, 8-byte words"),
                             ("16-byte quads", "16-byte quads, a quad per thread"), ("torch", "torch copy_"))},
    "gather, useful GB/s: stride 1 / 8 / 32": ("{}", lambda: "{:.0f} / {:.0f} / {:.0f}".format(
        *(chapter.figure(f"gather stride {k}", f"stride {k}", "gbps") for k in (1, 8, 32)))),
    "load latency, idle GPU": ("{:.0f} ns", lambda: chapter.figure("bytes in flight", "latency_ns")),
    "bytes in flight an SM needs (Little's law)": ("{:.1f} KB", lambda: chapter.figure(
        "bytes in flight", "needed_kb_per_sm")),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch00.N` and `# <<< ch00.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch00`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch00.1")

# %%
exercises.show("ch00.2")

# %%
exercises.show("ch00.3")

# %%
exercises.show("ch00.4")

# %% [markdown]
# ## More to try
# 1. Change `LOADS_IN_FLIGHT`'s kernel to 2 and to 8 loads per trip. Predict, then measure.
# 2. Write `copy_quads_kernel` as a grid-stride loop with 1, 2 and 4 quads in flight per trip, and
#    measure it against the one-quad-per-thread kernel (`quad_sweep.py` tries 36 such shapes).
# 3. Make `gather_strided` read `src[(i * stride) % n]`: every element is used, but is it fast?
# 4. Break the copy on purpose (drop the tail loop) and read what `assert_close` tells you.
#
# ## References
# - NVIDIA, *CUDA C++ Best Practices Guide*, "Coalesced Access to Global Memory".
# - M. Harris, "CUDA Pro Tip: Write Flexible Kernels with Grid-Stride Loops".
