"""The grammar gate's child process (grammar_gate.py): compiles each grammar it is sent as vLLM's xgrammar backend
compiles it in the EngineCore (`XgrammarBackend.compile_grammar`: the same tokenizer, vocabulary size and calls),
one at a time, and answers how it went. Killed by its parent when a compile runs past the deadline.

    python -m app.engine.vllm.grammar_worker TOKENIZER_FOLDER VOCAB_SIZE TRUST_REMOTE_CODE
    stdin:  {"kind": "json" | "ebnf" | "lark" | "regex", "spec": "..."} per line
    stdout: {"ready": true} once, then {"ok": true} or {"ok": false, "error": "..."} per request
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

CACHE_BYTES = 64 * 2**20


def _exit_with_parent(parent: int) -> None:
    # A parent that died cannot kill this process in the middle of a compile: the compile's thread holds no lock
    # that matters, so leave at once.
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(0)


def main(folder: str, vocab_size: int, trust_remote_code: bool) -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what the libraries print goes to stderr, never into the answers
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    import xgrammar as xgr
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    # One thread: the gate's compile must not take the engine's cores (the process keeps the front end's). The cache
    # on, as vLLM's: xgrammar compiles another way with it (a patternProperties that compiles without it fails with
    # it), and the engine's answer is the one to foresee. Small: the gate keeps its verdicts, not the grammars.
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=True, cache_limit_bytes=CACHE_BYTES)
    compile_by_kind = {"json": lambda spec: compiler.compile_json_schema(spec, any_whitespace=True),
                       "ebnf": compiler.compile_grammar, "lark": compiler.compile_lark,
                       "regex": compiler.compile_regex}
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        try:
            compile_by_kind[request["kind"]](request["spec"])
            answer: dict[str, object] = {"ok": True}
        except Exception as err:  # the engine refuses it as it does today: only the time is the gate's business
            answer = {"ok": False, "error": str(err)[:500]}
        answers.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1")
