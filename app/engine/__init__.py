"""The one seam between serving and inference: the `Engine` protocol and the neutral types that cross it (and the
Ray handle), the fake engine, vLLM's engine behind it (`vllm/`, the only package that imports vLLM), what a request
has produced so far and the requests that resume it (`continuation`), the CPU placement it needs (`cpu/`), the
engine's processes and the model store."""
