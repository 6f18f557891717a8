"""Mirrors src/transformers_neuronx/constants.py (0.13.x, 1ade6d7): the layout names and enums NeuronConfig uses."""

import enum

LAYOUT_BSH = "BSH"
LAYOUT_HSB = "HSB"
LAYOUT_SBH = "SBH"


class Layout(enum.Enum):
    HSB = "HSB"
    BSH = "BSH"
    SBH = "SBH"

    def __eq__(self, value):  # as the real enum: a layout equals its string name
        return super().__eq__(Layout(value))

    __hash__ = enum.Enum.__hash__


class GQA(enum.Enum):
    SHARD_OVER_HEADS = "shard-over-heads"
    SHARD_OVER_BATCH = "shard-over-batch"
    REPLICATED_HEADS = "replicated-heads"
    ALL_GATHER_HEADS = "all-gather-heads"
