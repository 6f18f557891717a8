"""`neuronmodel-runtime`: serve | info | selftest. Parses the one RuntimeConfig at the edge and wires the parts."""

from __future__ import annotations

import argparse
import functools
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from neuronmodel_runtime.config import ConfigError, RuntimeConfig, default_model_path, load_config
from neuronmodel_runtime.frameworks import FrameworkError, detect_frameworks, report, select_framework

log = logging.getLogger("neuronmodel_runtime")

#: --flag -> dotted RuntimeConfig field (flags override the file and the environment).
FLAGS = {
    "model": "model",
    "framework": "framework",
    "dtype": "dtype",
    "device": "device",
    "max_num_seqs": "max_num_seqs",
    "max_model_len": "max_model_len",
    "max_context_length": "max_context_length",
    "host": "server.host",
    "port": "server.port",
    "api_key": "server.api_key",
    "served_model_name": "server.served_model_name",
    "speculation_mode": "speculation.mode",
    "draft_model": "speculation.draft_model",
    "num_speculative_tokens": "speculation.num_speculative_tokens",
    "on_device_sampling": "sampling.on_device",
}


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="RuntimeConfig JSON file")
    common.add_argument("--log-level", default="INFO")
    for flag, field in FLAGS.items():
        common.add_argument("--" + flag.replace("_", "-"), dest=flag, help=f"overrides {field}")
    parser = argparse.ArgumentParser(prog="neuronmodel-runtime", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", parents=[common], help="serve the OpenAI-compatible HTTP API")
    sub.add_parser("info", parents=[common], help="print framework detection and the effective config as JSON")
    st = sub.add_parser("selftest", parents=[common], help="load the model and generate a few tokens")
    st.add_argument("--tokens", type=int, default=16)
    return parser


def _config(args: argparse.Namespace) -> RuntimeConfig:
    overrides = {field: getattr(args, flag) for flag, field in FLAGS.items() if getattr(args, flag) is not None}
    return load_config(args.config, overrides)


def model_path_of(config: RuntimeConfig) -> Path:
    path = Path(config.model) if config.model else default_model_path()
    if not (path / "config.json").is_file():
        hint = "run `make default-model` (scripts/fetch_default_model.py)" if not config.model else "check `model`"
        raise ConfigError(f"model: no Hugging Face model folder (config.json) at {path}; {hint}")
    return path


def prompt_lookup_proposer(config: RuntimeConfig) -> Optional[Callable[[list[int], int], list[int]]]:
    """The engine's host-side proposer when speculation.mode is promptLookup, else None."""
    spec = config.speculation
    if spec.mode != "promptLookup":
        return None
    from neuronmodel_runtime.spec_decode.ngram import propose_ngram

    return functools.partial(propose_ngram, n_min=spec.prompt_lookup_min, n_max=spec.prompt_lookup_max)


def build_engine(config: RuntimeConfig, own_thread: bool = True) -> Any:
    """Select the framework, load the runner and tokenizer, and return a ready-to-start AsyncEngine.

    own_thread: the engine spawns its step thread; False leaves the step loop to the caller (`serve` runs it on
    the main thread).
    """
    from neuronmodel_runtime.engine.async_engine import AsyncEngine
    from neuronmodel_runtime.engine.engine import Engine
    from neuronmodel_runtime.engine.tokenizer import eos_token_ids, load_tokenizer
    from neuronmodel_runtime.runners.registry import create_runner

    detection = detect_frameworks()
    selection = select_framework(config.framework, detection)
    for warning in selection.warnings:
        log.warning(warning)
    path = model_path_of(config)
    log.info("framework %s %s (%s); loading %s", selection.framework, selection.version, selection.reason, path)
    started = time.monotonic()
    runner = create_runner(selection.framework, config, str(path))
    runner.load()
    tokenizer = load_tokenizer(path)
    log.info("model loaded in %.1f s: %s", time.monotonic() - started, json.dumps(runner.info()))
    engine = Engine(
        runner,
        tokenizer,
        eos_token_ids(path, tokenizer),
        config.max_num_batched_tokens,
        config.server.request_timeout_s,
        proposer=prompt_lookup_proposer(config),
    )
    return AsyncEngine(
        engine,
        tokenizer=tokenizer,
        model_name=config.server.served_model_name or path.name,
        max_queue=config.server.max_queue,
        info={"framework": report(config.framework, detection), "speculation": config.speculation.model_dump()},
        own_thread=own_thread,
    )


def _serve(config: RuntimeConfig) -> int:
    engine = build_engine(config, own_thread=False)
    from neuronmodel_runtime.server.app import create_app
    from neuronmodel_runtime.server.runner import serve

    return serve(create_app(engine, config), config)


def _selftest(config: RuntimeConfig, tokens: int) -> int:
    """Greedy-generate from two chat prompts through the real engine, synchronously; print JSON."""
    from neuronmodel_runtime.engine.tokenizer import chat_prompt_ids
    from neuronmodel_runtime.sampling.params import SamplingParams

    engine = build_engine(config).engine
    tok = engine.tokenizer
    prompts = ["What is the capital of France?", "Write a haiku about the sea."]
    texts = {str(i): "" for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        ids = chat_prompt_ids(tok, [{"role": "user", "content": prompt}])
        engine.add(engine.make_request(str(i), ids, SamplingParams(temperature=0.0, max_tokens=tokens)))
    started, produced = time.monotonic(), 0

    def collect(outputs: list) -> None:
        nonlocal produced
        for out in outputs:
            texts[out.request_id] += out.text
            produced += len(out.token_ids)

    while engine.has_work:
        engine.step(collect)
    elapsed = time.monotonic() - started
    print(json.dumps({"outputs": texts, "tokens": produced, "tokens_per_s": round(produced / elapsed, 1)}))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = _config(args)
        if args.command == "info":
            print(json.dumps({**report(config.framework, detect_frameworks()), "config": config.public_dict()}, indent=2))
            return 0
        if args.command == "selftest":
            return _selftest(config, args.tokens)
        return _serve(config)
    except (ConfigError, FrameworkError) as exc:
        print(f"neuronmodel-runtime: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
