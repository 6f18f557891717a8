"""README.md cannot rot: its configuration table lists exactly the settings table's fields, env variables and
flags."""

from __future__ import annotations

import re
from pathlib import Path

from neuronmodel_runtime.config import SETTINGS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

#: Variables a field honours besides its own NEURONMODEL_ one.
ENV_ALIASES = {"framework": {"VLLM_NEURON_FRAMEWORK"}}


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
    rows = config_table(README.read_text())
    assert set(rows) == set(SETTINGS), "README's configuration table must list exactly RuntimeConfig's fields"
    for path, setting in SETTINGS.items():
        assert rows[path] == {"env": {setting.env} | ENV_ALIASES.get(path, set()), "flag": {setting.flag}}, path
