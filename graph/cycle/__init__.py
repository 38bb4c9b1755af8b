"""The cycle graph: the closed loop, one pass per cycle; its state, runtime (context), and the stages its nodes call."""
