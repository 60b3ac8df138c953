"""The OpenAI wire: request models by API (chat, completions, Responses, embeddings, tools, structured outputs),
each converting itself into the engine's neutral request, and the answers' and chunks' shapes. No HTTP and no
engine implementation."""
