"""Helpers shared by the test suites, imported as `tests.support.<module>`; no test lives here.

fake_stack   the unit tests' in-process stack: configs, requests, an app over a FakeEngine
waiting      waiting for a condition with a deadline (instead of sleeping)
sse          decoding SSE bodies
error_shape  the OpenAI error shape and its check
hostile      the hand-written hostile request list (unit and real-stack)
fuzzing      what the in-process and the real-stack fuzz share
stacks       a real stack of a test's own (integration: tests that break or stop it)
"""
