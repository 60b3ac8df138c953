"""What one replica does with a neutral request: admit it (admission by count, tokens and time, the engine's
learned pace), render and tokenize its prompt, run it on the engine, watch the engine's progress, and restart a
broken engine in place. No HTTP and no Ray."""
