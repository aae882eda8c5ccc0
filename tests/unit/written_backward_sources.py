"""Module DSL sources with written backward: sections, shared by the tests of --verify-backward."""

TWO_LAYER = """module TwoLayer(d: int = 6):
  params:
    w: [d, d]
  forward:
    in: x: [B, d, fp32]
    out: [B, d, fp32]
    graph:
      x -> matmul(w, transpose=NT) -> h
      h -> silu() -> a
      a -> matmul(w, transpose=NT) -> out
    save: [x, h]
  backward:
    d_out: [B, d, fp32]
    graph:
      recompute:
        saved.h -> silu() -> a
      (d_out, w) -> matmul(transpose=NN) -> d_a
      (d_out, a) -> matmul(transpose=TN, accumulate=true) -> d_w
      (d_a, saved.h) -> silu_backward() -> d_h
      (d_h, w) -> matmul(transpose=NN) -> d_x
      (d_h, saved.x) -> matmul(transpose=TN, accumulate=true) -> d_w
"""
