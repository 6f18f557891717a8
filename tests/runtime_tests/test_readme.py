"""README.md cannot rot: its configuration table lists exactly the settings table's fields, env variables and
flags, and every command and request it shows is run as written.

Fenced ```bash / ```python blocks (and unlabelled blocks that start with a command) are parsed, not hard-coded:
each `neuronmodel-runtime serve ...` command is started (on a free port of 127.0.0.1, the only change) and
answers a completion; each curl command and python block is run against the server of `make run` (the Makefile's
own recipe, which the README's requests target); `neuronmodel-runtime info` and `selftest` are run. A command
that this file does not run must be in COVERED_ELSEWHERE with what covers it, or the test fails.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from neuronmodel_runtime.config import SETTINGS, default_model_path

from runtime_tests.helpers import probe

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SCRIPT = Path(sys.executable).parent / "neuronmodel-runtime"

#: Variables a field honours besides its own NEURONMODEL_ one.
ENV_ALIASES = {"framework": {"VLLM_NEURON_FRAMEWORK"}}

#: README commands run by something else, and what runs them.
COVERED_ELSEWHERE = {
    "make test": ".ci/run",  # CI's entry point; it runs every test, this file included
    "make k8s-bin": "tests/integration/conftest.py",  # control_plane skips, naming it, without its binaries
    "make cluster": "tests/integration/conftest.py",  # control_plane starts the same k8s.cluster.ControlPlane
    "make cluster-down": "tests/integration/conftest.py",  # ... and stops it
    "make bench": "tests/test_bench_report.py",  # bench/report.py runs every bench/*.py; tested on fake benches
    # the operator quick start, step by step as tests/integration/ runs it on the same control plane
    "kubectl apply --server-side -f crds/neuronmodels.neuronmodel.dev.yaml": "tests/integration/conftest.py",
    ".venv/bin/neuronmodel-operator --runtime-image neuronmodel-runtime:dev --allow-host-path":
        "tests/integration/conftest.py",
    "kubectl apply -f crds/samples/tiny-torch.yaml": "tests/integration/test_operator.py",
    "kubectl get nm": "tests/integration/test_operator.py",
    "kubectl scale nm tiny-torch --replicas=2": "tests/integration/test_operator.py",
    # the compile Job's command, on the NxDI fake with a filesystem store
    "neuronmodel-runtime compile --config /etc/neuronmodel/config.json": "tests/runtime_tests/artifacts/test_compile_job.py",
    # the chart: installed from a checkout and from the OCI registry `make chart` feeds, on the same control plane
    "helm install neuronmodel charts/neuronmodel-operator -n neuronmodel-system --create-namespace":
        "tests/integration/test_chart_install.py",
    "make chart": "tests/integration/test_chart_oci.py",
    "sudo make e2e": "tests/integration/realnode/test_end_to_end.py",  # make test runs that module too
    # a group of two hosts: test_group_processes.py starts these two (on free ports, with small limits)
    "LWS_LEADER_ADDRESS=127.0.0.1 LWS_GROUP_SIZE=2 LWS_WORKER_INDEX=0 neuronmodel-runtime serve --model "
    "tests/assets/tiny/target --framework torch --nodes 2 --tensor-parallel-degree 2":
        "tests/runtime_tests/distributed/test_group_processes.py",
    "LWS_LEADER_ADDRESS=127.0.0.1 LWS_GROUP_SIZE=2 LWS_WORKER_INDEX=1 neuronmodel-runtime worker --model "
    "tests/assets/tiny/target --framework torch --nodes 2 --tensor-parallel-degree 2":
        "tests/runtime_tests/distributed/test_group_processes.py",
}

SHELL_LANGUAGES = {"bash", "sh", "shell", "console"}
#: First words that make an unlabelled block a command block (else it is a listing, such as the architecture).
COMMAND_WORDS = {"make", "curl", "neuronmodel-runtime", "python", "python3", "pip", "kubectl", "helm", "export"}
#: The address the README's requests are written against; the tests substitute their server's.
README_URL = re.compile(r"http://(?:127\.0\.0\.1|localhost):8000")


# --- parsing --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    language: str
    text: str
    line: int  # of the opening fence


@dataclass(frozen=True)
class Command:
    text: str
    line: int  # of the block it is in

    @property
    def argv(self) -> list[str]:
        return shlex.split(self.text)


def fenced_blocks(markdown: str) -> list[Block]:
    return [
        Block(m.group(1).lower(), m.group(2), markdown.count("\n", 0, m.start()) + 1)
        for m in re.finditer(r"^```([\w+-]*)[^\n]*\n(.*?)^```[ \t]*$", markdown, re.M | re.S)
    ]


def split_commands(script: str) -> list[str]:
    """A shell script's commands: an unquoted newline ends one (a backslash-newline continues it), and unquoted
    `#` comments are dropped. Quoted newlines, such as curl's multi-line -d bodies, stay inside the command."""
    commands, current, quote, i = [], [], None, 0
    while i < len(script):
        ch = script[i]
        if quote:
            quote = None if ch == quote else quote
            current.append(ch)
        elif ch in "'\"":
            quote = ch
            current.append(ch)
        elif ch == "\\" and script[i + 1:i + 2] == "\n":
            current.append(" ")
            i += 1
        elif ch == "#" and (not current or current[-1].isspace()):
            while i + 1 < len(script) and script[i + 1] != "\n":
                i += 1
        elif ch == "\n":
            commands.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    commands.append("".join(current))
    return [c.strip() for c in commands if c.strip()]


def readme_commands(markdown: str) -> list[Command]:
    """Every shell command in the README's command blocks."""
    commands = []
    for block in fenced_blocks(markdown):
        found = [Command(text, block.line) for text in split_commands(block.text)]
        if block.language in SHELL_LANGUAGES or (block.language == "" and found and found[0].argv[0] in COMMAND_WORDS):
            commands += found
    return commands


def python_blocks(markdown: str) -> list[Block]:
    return [block for block in fenced_blocks(markdown) if block.language in ("python", "py")]


def inline_cli_commands(markdown: str) -> list[Command]:
    """`neuronmodel-runtime info` / `selftest` as the prose shows them (inline code)."""
    return [Command(m.group(1), markdown.count("\n", 0, m.start()) + 1)
            for m in re.finditer(r"`(neuronmodel-runtime (?:info|selftest)\b[^`]*)`", markdown)]


def make_recipe(target: str, makefile: str) -> list[str]:
    """The recipe lines of a Makefile target (KeyError: no such target)."""
    lines = makefile.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(rf"{re.escape(target)}\s*:", line)]
    if not starts:
        raise KeyError(f"the Makefile has no target {target!r}")
    start, recipe = starts[0], []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


def served_command(command: Command) -> Optional[list[str]]:
    """The `neuronmodel-runtime serve ...` argv a README command runs, directly or as its make target's recipe."""
    argv = command.argv
    if argv[:2] == ["make", "run"] and len(argv) == 2:
        argv = shlex.split(make_recipe("run", (ROOT / "Makefile").read_text())[-1].replace("$(VENV)/bin/", ""))
    return argv if argv[:2] == ["neuronmodel-runtime", "serve"] else None


def kind(command: Command) -> str:
    """request | serve | cli | mapped | uncovered."""
    argv = command.argv
    if argv[0] == "curl":
        return "request"
    if served_command(command):
        return "serve"
    if argv[:2] in (["neuronmodel-runtime", "info"], ["neuronmodel-runtime", "selftest"]):
        return "cli"
    return "mapped" if " ".join(argv) in COVERED_ELSEWHERE else "uncovered"


TEXT = README.read_text()
COMMANDS = readme_commands(TEXT)
MAKE_RUN = Command("make run", 0)


def of_kind(name: str) -> list[Command]:
    return [c for c in COMMANDS if kind(c) == name]


def distinct(commands: list[Command]) -> list[tuple[Command, list[int]]]:
    """Each command once (the README shows `neuronmodel-runtime selftest` in three places: one run answers for
    all), with the lines that show it."""
    seen: dict[tuple[str, ...], tuple[Command, list[int]]] = {}
    for c in commands:
        seen.setdefault(tuple(c.argv), (c, []))[1].append(c.line)
    return list(seen.values())


# --- the README as documentation (fast) ------------------------------------------------------------------------


def config_table(text: str) -> dict[str, dict[str, set[str]]]:
    """field -> {"env": names, "flag": names} from the `| field | default | meaning | env | flag |` table."""
    lines = text.splitlines()
    start = lines.index("| field | default | meaning | env | flag |")
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        field, env, flag = cells[0], cells[-2], cells[-1]
        rows[field.strip("`")] = {"env": set(re.findall(r"`([^`]+)`", env)), "flag": set(re.findall(r"`([^`]+)`", flag))}
    return rows


def test_config_table_lists_every_field_with_its_env_variable_and_flag():
    rows = config_table(TEXT)
    assert set(rows) == set(SETTINGS), "README's configuration table must list exactly RuntimeConfig's fields"
    for path, setting in SETTINGS.items():
        assert rows[path] == {"env": {setting.env} | ENV_ALIASES.get(path, set()), "flag": {setting.flag}}, path


def test_every_readme_command_is_run_here_or_mapped():
    uncovered = [f"line {c.line}: {c.text}" for c in of_kind("uncovered")]
    assert not uncovered, (
        f"README commands that no test runs: {uncovered}; run them in {Path(__file__).name} or add them to "
        "COVERED_ELSEWHERE with what covers them")
    assert of_kind("request") and of_kind("serve") and python_blocks(TEXT), "the README's examples were not found"
    assert {c.argv[1] for c in inline_cli_commands(TEXT)} == {"info", "selftest"}


def test_mapped_commands_exist_and_so_do_what_covers_them():
    targets = (ROOT / "Makefile").read_text()
    for command, covered_by in COVERED_ELSEWHERE.items():
        assert f"`{command}" in TEXT or any(c.text == command for c in COMMANDS), f"stale mapping: {command}"
        assert (ROOT / covered_by).exists(), covered_by
        if command.startswith("make "):
            make_recipe(command.split()[1], targets)  # the target exists


def test_the_parser_keeps_quoted_newlines_and_drops_comments():
    script = "make a   # why\n# alone\ncurl -d '{\n  \"x\": 1 # not a comment\n}' \\\n    -s\nneuronmodel-runtime serve\n"
    assert split_commands(script) == ["make a", "curl -d '{\n  \"x\": 1 # not a comment\n}'      -s",
                                      "neuronmodel-runtime serve"]
    blocks = fenced_blocks("x\n```bash\nmake run\n```\n\n```\nruntime/\n  cli.py\n```\n")
    assert [(b.language, b.line) for b in blocks] == [("bash", 2), ("", 6)]
    assert [c.text for c in readme_commands("```\nruntime/\n  x.py\n```\n```\nmake run  # serve\n```\n")] == ["make run"]


def test_commands_are_classified_so_that_a_new_one_is_run_or_fails():
    assert [kind(Command(text, 1)) for text in (
        "curl -s http://127.0.0.1:8000/v1/models", "neuronmodel-runtime serve --port 9000", "make run",
        "neuronmodel-runtime info", "make cluster", "kubectl apply -f x.yaml", "neuronmodel-runtime fetch x",
    )] == ["request", "serve", "serve", "cli", "mapped", "uncovered", "uncovered"]
    assert on_port(["serve", "--port", "80", "--host=0.0.0.0", "--model", "m"], 5) == [
        "serve", "--model", "m", "--host", "127.0.0.1", "--port", "5"]


# --- the README's commands, run (slow) -------------------------------------------------------------------------

HAS_DEFAULT_MODEL = (default_model_path() / "config.json").is_file()
needs_default_model = [
    pytest.mark.smollm2,
    pytest.mark.skipif(not HAS_DEFAULT_MODEL, reason="embedded default model not converted: run `make default-model`"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def clean_env() -> dict[str, str]:
    """This environment without settings of its own (NEURONMODEL_CACHE, where models live, stays)."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith("NEURONMODEL_") and k != "NEURONMODEL_CACHE") and k != "VLLM_NEURON_FRAMEWORK"}


def on_port(args: list[str], port: int) -> list[str]:
    """args with any --host / --port replaced by 127.0.0.1 and `port`."""
    kept, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg in ("--host", "--port"):
            skip = True
        elif not arg.startswith(("--host=", "--port=")):
            kept.append(arg)
    return [*kept, "--host", "127.0.0.1", "--port", str(port)]


def uses_default_model(argv: list[str]) -> bool:
    return not any(arg == "--model" or arg.startswith("--model=") for arg in argv)


@contextmanager
def serving(argv: list[str]) -> Iterator[str]:
    """Run a README `neuronmodel-runtime serve ...` command until /ready; yields its base URL."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([str(SCRIPT), *on_port(argv[1:], port)], cwd=ROOT, env=clean_env(),
                                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 300
            while not ready(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    pytest.fail(f"{shlex.join(argv)} did not become ready:\n{log.read().decode()[-3000:]}")
                time.sleep(0.25)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def ready(url: str) -> bool:
    try:
        return probe.get(f"{url}/ready", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def choice_text(choice: dict) -> str:
    return choice.get("text") or (choice.get("message") or choice.get("delta") or {}).get("content") or ""


def check_response(body: str) -> None:
    """A completion (plain or streamed) has text in every choice; any other JSON answer parses."""
    if body.lstrip().startswith("data:"):
        events = [line[len("data: "):] for line in body.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", body[-500:]
        chunks = [json.loads(event) for event in events[:-1]]
        assert "".join(choice_text(c) for chunk in chunks for c in chunk["choices"]).strip(), body[:500]
    elif body.lstrip().startswith("{"):
        data = json.loads(body)
        assert "error" not in data, data
        assert all(choice_text(c).strip() for c in data.get("choices", [])), data
    else:
        assert body.strip()


def smoke(url: str) -> None:
    """The served model answers a short completion."""
    model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
    reply = httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": model, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


@pytest.fixture(scope="module")
def make_run_server() -> Iterator[str]:
    """The server of `make run` (its Makefile recipe), which the README's requests are written against."""
    with serving(served_command(MAKE_RUN)) as url:
        yield url


def line_id(item) -> str:
    return f"line{item.line}"


@pytest.mark.slow
@pytest.mark.parametrize("command", [pytest.param(c, marks=needs_default_model) for c in of_kind("request")],
                         ids=line_id)
def test_readme_curl_request(make_run_server, command):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    mark = "\n__HTTP_STATUS__ "
    script = README_URL.sub(make_run_server, command.text) + f" --write-out '{mark}%{{http_code}}'"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=180)
    body, _, status = out.stdout.rpartition(mark)
    assert out.returncode == 0 and status == "200", (out.returncode, status, body[-1000:], out.stderr[-1000:])
    check_response(body)


@pytest.mark.slow
@pytest.mark.parametrize("block", [pytest.param(b, marks=needs_default_model) for b in python_blocks(TEXT)],
                         ids=line_id)
def test_readme_python_snippet(make_run_server, block):
    out = subprocess.run([sys.executable, "-c", README_URL.sub(make_run_server, block.text)], cwd=ROOT,
                         env=clean_env(), capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip()


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    pytest.param(c, marks=needs_default_model if uses_default_model(served_command(c)) else [])
    for c in of_kind("serve")
], ids=line_id)
def test_readme_serve_command(command, request):
    argv = served_command(command)
    if argv == served_command(MAKE_RUN):  # already running for the requests
        smoke(request.getfixturevalue("make_run_server"))
        return
    with serving(argv) as url:
        smoke(url)


@pytest.mark.slow
@pytest.mark.parametrize("command", [
    pytest.param(c, marks=needs_default_model if uses_default_model(c.argv) else [],
                 id=f"{c.argv[1]}-line{'-'.join(map(str, lines))}")
    for c, lines in distinct([*of_kind("cli"), *inline_cli_commands(TEXT)])
])
def test_readme_cli_command(command):
    out = subprocess.run([str(SCRIPT), *command.argv[1:]], cwd=ROOT, env=clean_env(), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    if command.argv[1] == "info":
        data = json.loads(out.stdout)
        assert data["selected"]["framework"] and data["config"]["max_model_len"] >= 1
    else:
        lines = out.stdout.splitlines()
        assert lines[-1] == "selftest passed" and any(line.startswith("pass  greedy") for line in lines), out.stdout
