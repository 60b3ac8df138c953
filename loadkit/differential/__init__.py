"""The differential harness (`python -m loadkit differential`): the same requests to bare vLLM (the same install,
model, name and engine arguments) and to this service, compared field by field.

Modules: cases (the curated and the property-generated requests), exchange (one request sent, its answer read),
compare (what is left out of a comparison, and the field-by-field diff), differences (the deliberate, documented
differences), verdict (one case's outcome), peer (the bare-vLLM process), report (docs/differential.md), run (the
long run and its command line).
"""
