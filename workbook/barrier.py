"""A grid-wide barrier written in the kernel: a counter in global memory that every block adds 1 to
and then waits on, until it reaches (barriers passed) x (blocks).

numba's `cuda.cg.this_grid().sync()` does the same job, but it is a call into the CUDA device
runtime, and a call is where the compiler saves to the stack every register that is live across it:
a kernel that keeps its weights in registers (chapter 10's wavefront LSTM) pays for a save and a
reload of all of them at every barrier. This barrier is inline, three instructions and a loop:

    arrive(counter)           red.release.gpu.u64 [counter], 1: adds 1, returns nothing; "release"
                              makes every write this thread has seen (its block's, after a
                              syncthreads) visible to whoever later sees the new count
    arrived(counter) -> int   ld.acquire.gpu.u64: the count, read from L2 each time; "acquire"
                              makes the writes released before that count visible to this block
    counter_barrier(counter, target)
                              syncthreads; thread 0 arrives and waits until the count reaches
                              target; syncthreads: after it, every block's writes before it are seen
    counter_leave(counter, blocks)
                              after the last barrier: the last block out zeroes the counter

(CUTLASS's generic barrier is built the same way.) `counter` is a 2-element uint64 array (zero
before the first barrier); the kernel passes target = (barriers so far, this one included) x blocks.
Every block must be resident, or the first ones wait for ever for blocks that never start: launch
cooperatively (a kernel that calls `cuda.cg.this_grid()` is launched so, and refused if the grid
cannot all be resident). In the simulator, arrive and arrived are atomics on the counter, and the
blocks of a cooperative launch run side by side (workbook.simulator), so the barrier works there too.
"""

import numba
from numba import cuda

from . import MODE

if MODE != "sim":  # a GPU, or the compile worker: the real instructions
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def _counter_ok(counter):
        return isinstance(counter, types.Array) and counter.dtype == types.uint64

    def _pointer(context, builder, signature, args):
        return context.make_array(signature.args[0])(context, builder, args[0]).data

    @intrinsic
    def arrive(typingctx, counter):
        if not _counter_ok(counter):
            return None

        def codegen(context, builder, signature, args):
            pointer = _pointer(context, builder, signature, args)
            add = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [pointer.type]), "red.release.gpu.add.u64 [$0], 1;",
                               "l,~{memory}", side_effect=True)  # no result: without side effects LLVM deletes it
            builder.call(add, [pointer])
            return context.get_dummy_value()

        return types.void(counter), codegen

    @intrinsic
    def arrived(typingctx, counter):
        if not _counter_ok(counter):
            return None

        def codegen(context, builder, signature, args):
            pointer = _pointer(context, builder, signature, args)
            load = ir.InlineAsm(ir.FunctionType(ir.IntType(64), [pointer.type]), "ld.acquire.gpu.u64 $0, [$1];",
                                "=l,l,~{memory}", side_effect=True)  # read each time round the loop
            return builder.call(load, [pointer])

        return types.uint64(counter), codegen

else:  # the simulator

    def arrive(counter):
        cuda.atomic.add(counter, 0, 1)

    def arrived(counter):
        return cuda.atomic.add(counter, 0, 0)


@cuda.jit(device=True)
def counter_barrier(counter, target):
    """Every block of the grid meets here; `target`: this barrier's number (from 1) x the blocks."""
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0 and cuda.threadIdx.z == 0:
        arrive(counter)
        while arrived(counter) < target:
            pass
    cuda.syncthreads()


@cuda.jit(device=True)
def counter_leave(counter, blocks):
    """After a kernel's last barrier: the last of `blocks` blocks to leave zeroes the counter (both
    words: the count and counter[1], where the blocks count themselves out), ready for the next
    launch. Every other block is past its last barrier by then, so none reads it again."""
    if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0 and cuda.threadIdx.z == 0:
        if cuda.atomic.add(counter, 1, 1) == numba.uint64(blocks) - numba.uint64(1):
            counter[0] = 0
            counter[1] = 0


def unsafe_grid_sync(kernel):
    """Where a kernel's `cuda.cg.this_grid().sync()` might not be reached by every thread, read from
    its source: a `.sync()` inside an `if`, or after an `if` that returns. On a GPU such a launch
    hangs (the simulator names the block that skipped it instead): a wrapper that launches code it
    did not write (an exercise's answer) asks this first. "line N: why", or None. Conservative: an
    `if` that every thread takes the same way is flagged too."""
    import ast
    import inspect
    import textwrap

    function = getattr(kernel, "py_func", kernel)
    lines, first = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    found, branches, returned = [], [0], []

    class Finder(ast.NodeVisitor):
        def visit_If(self, node):
            branches[0] += 1
            self.generic_visit(node)
            branches[0] -= 1

        visit_IfExp = visit_If

        def visit_Return(self, node):
            if branches[0]:
                returned.append(node.lineno + first - 1)

        def visit_Call(self, node):
            if isinstance(node.func, ast.Attribute) and node.func.attr == "sync" and not found:
                line = node.lineno + first - 1
                if branches[0]:
                    found.append(f"line {line}: a grid.sync() inside an if, which threads that take the "
                                 "other way never reach")
                elif returned:
                    found.append(f"line {line}: a grid.sync() after the return at line {returned[0]}, "
                                 "which threads that return never reach")
            self.generic_visit(node)

    Finder().visit(tree)
    return found[0] if found else None
