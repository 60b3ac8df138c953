"""vLLM behind the `Engine` seam: `AsyncLLM` built from the model's config, neutral requests converted into vLLM's
types and its outputs back, and vLLM's tool-call parsers. The only package that imports vLLM."""
