"""OpenAI-compatible LLM serving: vLLM engines hosted in Ray Serve replicas."""
