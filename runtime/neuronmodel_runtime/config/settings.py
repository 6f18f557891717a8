"""How a RuntimeConfig field is named outside the JSON: its NEURONMODEL_* variable and its flag.

Every leaf field is a setting: `NEURONMODEL_<NAME>` and `--<name>`, where the name is the field's key, or its
QUALIFIED_NAMES entry when the key says too little outside its section. `settings_table` builds the one table
behind the variables and flags from the fields themselves (load.py holds RuntimeConfig's, SETTINGS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from neuronmodel_runtime.config.env import ENV_PREFIX

#: Settings whose name is not their own key: a key that says too little outside its section gets the section's
#: name (`speculation.mode` -> `speculation_mode`); `on_device_sampling` predates this rule and is documented.
QUALIFIED_NAMES = {
    "sampling.on_device": "on_device_sampling",
    "speculation.mode": "speculation_mode",
    "compile_cache.url": "compile_cache_url",
    "compile_cache.policy": "compile_cache_policy",
}


def setting_name(path: str) -> str:
    """The name of the field at dotted `path`: its key, or its QUALIFIED_NAMES entry."""
    return QUALIFIED_NAMES.get(path, path.rsplit(".", 1)[-1])


def _env(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@dataclass(frozen=True)
class Setting:
    """One leaf field of RuntimeConfig, settable as NEURONMODEL_<NAME> and as --<name> (underscores as dashes)."""

    path: str  # dotted field path, e.g. "server.port"
    name: str  # the field's key, or its QUALIFIED_NAMES entry: "port"
    field: FieldInfo

    @property
    def env(self) -> str:
        return _env(self.name)

    @property
    def flag(self) -> str:
        return _flag(self.name)


def named(path: str) -> str:
    """A field as error messages name it: `server.port (--port, NEURONMODEL_PORT)`."""
    name = setting_name(path)
    return f"{path} ({_flag(name)}, {_env(name)})"


def _leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    """(dotted path, field) of every leaf field, recursing into nested config models."""
    for key, info in model.model_fields.items():
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            yield from _leaf_fields(info.annotation, f"{prefix}{key}.")
        else:
            yield prefix + key, info


def settings_table(model: type[BaseModel]) -> dict[str, Setting]:
    """Dotted path -> Setting for every leaf field of `model`: the one table behind env variables and flags.

    Raises:
        TypeError: two fields would share a name; the fix is a QUALIFIED_NAMES entry.
    """
    table: dict[str, Setting] = {}
    owners: dict[str, str] = {}
    for path, info in _leaf_fields(model):
        name = setting_name(path)
        if name in owners:
            raise TypeError(f"{path} and {owners[name]} would both be {_env(name)}; "
                            "give one of them a QUALIFIED_NAMES entry")
        owners[name] = path
        table[path] = Setting(path, name, info)
    return table
