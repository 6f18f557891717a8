"""The mutations scripts/mutation.py applies, one module per subject (see each module's docstring).

MUTATIONS joins them in the order the script runs and prints them."""

from . import (multi_node, operator_rules, placement_and_engines, robustness, runners_and_storage, sampling,
               vllm_artifacts)
from .definition import Mutation

MUTATIONS: list[Mutation] = [
    *sampling.MUTATIONS,
    *operator_rules.MUTATIONS,
    *runners_and_storage.MUTATIONS,
    *vllm_artifacts.MUTATIONS,
    *multi_node.MUTATIONS,
    *robustness.MUTATIONS,
    *placement_and_engines.MUTATIONS,
]
