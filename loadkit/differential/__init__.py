"""The differential harness: the same requests to bare vLLM (`python -m vllm.entrypoints.openai.api_server`, the
same install, model, name and engine arguments) and to this service, compared field by field.

Modules, one noun each: `peer` (the bare-vLLM process, started as the bench starts it), `exchange` (one request
sent, its answer read), `normalize` (what is left out of a comparison, and why), `compare` (the field-by-field
diff), `differences` (the deliberate, documented differences), `cases` (the curated set), `generate` (the
property-generated requests), `verdict` (one case's outcome), `report` (docs/differential.md), `run` (the long
run's driver).
"""
