"""Step 3, after NVIDIA's "Optimizing Recurrent Neural Networks in cuDNN 5": the layers in a
wavefront on streams of their own, and the whole forward replayed as one CUDA graph.

Step 2 runs every step of a layer before the next layer starts, though layer l+1's step t needs
only layer l's h_t. Here each layer launches on a stream of its own, in wavefront order: at
wavefront step s, layer l takes its step t = s - l and waits (an event) only for layer l-1's step
t, so the GPU may run layer l+1's step t-1 beside layer l's step t. A layer past the first cannot
hoist its input GEMM (its input arrives a step at a time): its step is three launches, the input
GEMM, the recurrent GEMM and the fused cell. `graph()` captures one forward with
`workbook.launch.StepGraph` (the layers' streams join the capture through the first event) and
replays it with one launch: what is left is the GPU's time."""

from workbook import cuda
from workbook.launch import StepGraph

from chapters.ch04_implicit_gemm.kernels import gemm

from .fused import THREADS, FusedLSTM, fused_cell_kernel


class StreamsLSTM(FusedLSTM):
    """Step 2's kernels, the layers in a wavefront on one stream each."""

    def __init__(self, weights):
        super().__init__(weights)
        self.streams = [cuda.stream() for _ in range(self.layers)]
        self._events = {}

    def graph(self, x, h0=None, c0=None, warmed_up=False):
        """A StepGraph of one forward on these buffers: graph() replays it; the outputs stay in this
        LSTM's buffers (self.outputs(x) after a replay). warmed_up=True: this LSTM has already run
        a forward on these same arrays, so the capture needs no run before it (StepGraph)."""
        return StepGraph(lambda stream: self(x, h0, c0, stream=stream), warmed_up=warmed_up)

    def outputs(self, x):
        """(y, h_n, c_n) as the last call or replay on x's shape left them."""
        T, B, _ = x.shape
        state = (self.layers, B, self.hidden)
        return (self._buffer(f"y of layer {self.layers - 1}", (T, B, self.hidden), 0),
                self._buffer("h_n", state, 0), self._buffer("c_n", state, 0))

    def _event(self, key):
        """One event per role, reused by every call (a wait sees the event's latest record)."""
        if key not in self._events:
            self._events[key] = cuda.event()
        return self._events[key]

    def _layers(self, x, h_n, c_n, stream):
        T, B, _ = x.shape
        H, L = self.hidden, self.layers
        start = self._event("start")
        start.record(stream)  # the zeroed or copied state first; in a capture, every stream joins it here
        for on in self.streams:
            start.wait(on)
        x_terms = self.input_terms(0, x, self.streams[0])
        ys = [self._buffer(f"y of layer {layer}", (T, B, H), stream) for layer in range(L)]
        step_inputs = [self._buffer(f"x terms of layer {layer}", (B, 4 * H), stream) for layer in range(L)]
        h_terms = [self._buffer(f"h terms of layer {layer}", (B, 4 * H), stream) for layer in range(L)]
        blocks = min(-(-B * H // THREADS), 1024)
        x_steps, y_steps = self._steps(x_terms), [self._steps(y) for y in ys]
        for s in range(T + L - 1):
            for layer in range(L):
                t, on = s - layer, self.streams[layer]
                if not 0 <= t < T:
                    continue
                if layer == 0:
                    x_term = x_steps[t]
                else:
                    self._event(("h", layer - 1, t)).wait(on)  # the layer below has written its h_t
                    x_term = step_inputs[layer]
                    gemm(y_steps[layer - 1][t], self.w_ih_t[layer], x_term, stream=on)
                gemm(h_n[layer] if t == 0 else y_steps[layer][t - 1], self.w_hh_t[layer], h_terms[layer], stream=on)
                fused_cell_kernel[blocks, THREADS, on](x_term, h_terms[layer], self.bias[layer], c_n[layer],
                                                       y_steps[layer][t])
                if layer < L - 1:
                    self._event(("h", layer, t)).record(on)
        for layer, on in enumerate(self.streams):
            h_n[layer].copy_to_device(ys[layer][T - 1], stream=on)
            done = self._event(("done", layer))
            done.record(on)
            done.wait(stream)  # the caller's stream goes on once every layer is done
        return ys[L - 1]
