"""Parse `vllm serve` argument lists with vLLM's own parser, without starting an engine: run by
test_vllm_args.py with the runtime-vllm-cpu image's Python (and a release's parser folder first on PYTHONPATH).

Usage: python vllm_parse.py OUT < cases.json. stdin: a JSON list of argument lists (what follows `vllm serve`).
OUT (not stdout, where vLLM logs): a JSON object, {"version": vLLM's, "file": where it was imported from,
"parsed": [...]}, each entry either {"error": what the parser said} or the fields test_vllm_args.py checks, as
`vllm serve` would see them: parsed by make_arg_parser (the `serve` subcommand's parser) on a
FlexibleArgumentParser, checked by validate_parsed_serve_args, and turned into AsyncEngineArgs by from_cli_args.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

import vllm

try:  # vLLM 0.30+ moved the serve arguments out of the openai package
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.utils.argparse_utils import FlexibleArgumentParser

#: AsyncEngineArgs fields reported (dicts and lists as JSON).
ENGINE_FIELDS = ("model", "served_model_name", "tensor_parallel_size", "max_num_seqs", "max_model_len", "dtype",
                 "enable_prefix_caching", "block_size", "num_gpu_blocks_override", "max_num_batched_tokens",
                 "async_scheduling", "additional_config", "speculative_config")
#: Frontend (server) fields reported.
SERVER_FIELDS = ("model_tag", "host", "port", "api_key")


def parse(argv: list[str]) -> dict:
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            args = parser.parse_args(argv)
    except SystemExit:
        return {"error": errors.getvalue().strip().splitlines()[-1]}
    validate_parsed_serve_args(args)
    args.model = args.model_tag  # as ServeSubcommand.cmd does: the positional model wins
    engine = AsyncEngineArgs.from_cli_args(args)
    out = {name: getattr(args, name) for name in SERVER_FIELDS}
    out.update({name: getattr(engine, name) for name in ENGINE_FIELDS})
    return json.loads(json.dumps(out, default=str))


def main() -> None:
    cases = json.load(sys.stdin)
    result = {"version": vllm.__version__, "file": vllm.__file__, "parsed": [parse(argv) for argv in cases]}
    with open(sys.argv[1], "w") as out:
        json.dump(result, out)


if __name__ == "__main__":
    main()
