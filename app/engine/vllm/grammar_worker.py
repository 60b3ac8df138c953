"""The grammar gate's child process (grammar_gate.py): compiles each grammar it is sent as vLLM's xgrammar backend
compiles it in the EngineCore (`XgrammarBackend.compile_grammar`: the same tokenizer, vocabulary size and calls),
one at a time, each in a child of its own killed at the deadline, and answers how it went. Killed by its parent if
it does not answer soon after the deadline.

    python -m app.engine.vllm.grammar_worker TOKENIZER_FOLDER VOCAB_SIZE TRUST_REMOTE_CODE DEADLINE_S
    stdin:  {"kind": "json" | "ebnf" | "lark" | "regex", "spec": "..."} per line
    stdout: {"ready": true} once, then per request {"ok": true}, or {"ok": false} with "error": "..." (the compiler
            refused it), "late": true (past the deadline) or "died": true (its compile ended the child)
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import threading
import time
from typing import Any

CACHE_BYTES = 64 * 2**20
PR_SET_PDEATHSIG = 1


def _exit_with_parent(parent: int) -> None:
    # A replica that died without closing its gate cannot kill this process: leave at once (a compile's child goes
    # with it, PR_SET_PDEATHSIG).
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def _compile(info: Any, kind: str, spec: str) -> dict[str, object]:
    import xgrammar as xgr

    # One thread: the gate's compile must not take the engine's cores (the process keeps the front end's). The cache
    # on, as vLLM's: xgrammar compiles another way with it (a patternProperties that compiles without it fails with
    # it), and the engine's answer is the one to foresee. Small: the gate keeps its verdicts, not the grammars.
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True, cache_limit_bytes=CACHE_BYTES)
    compile_by_kind = {"json": lambda spec: compiler.compile_json_schema(spec, any_whitespace=True),
                       "ebnf": compiler.compile_grammar, "lark": compiler.compile_lark,
                       "regex": compiler.compile_regex}
    try:
        compile_by_kind[kind](spec)
        return {"ok": True}
    except Exception as err:  # what the engine's compile would fail with
        return {"ok": False, "error": str(err)[:500]}


def _compile_within(info: Any, kind: str, spec: str, deadline_s: float) -> dict[str, object]:
    """The compile in a child forked from this process (its tokenizer loaded: no start to wait for), killed at the
    deadline. Starting this process again after each kill took 4 s on the 2-core Xeon (importing xgrammar 1.8 s)."""
    read, write = os.pipe()
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: compile, answer, leave at once; killed with this process if it is killed first
        try:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() == worker:  # else it died before the line above
                os.write(write, json.dumps(_compile(info, kind, spec)).encode())
        finally:
            os._exit(0)  # never back into the worker's loop
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        if not select.select([answer], [], [], deadline_s)[0]:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"ok": False, "late": True}
        data = answer.read()
    os.waitpid(pid, 0)
    return json.loads(data) if data else {"ok": False, "died": True}  # its memory, say: the engine's would too


def main(folder: str, vocab_size: int, trust_remote_code: bool, deadline_s: float) -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the libraries print goes to stderr, never into the answers
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        answers.write(json.dumps(_compile_within(info, request["kind"], request["spec"], deadline_s)) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", float(sys.argv[4]))
