"""Mirrors the interface of src/transformers_neuronx/mistral/model.py (0.13.x, 1ade6d7): `MistralForSampling` has
no `**kwargs` in forward (no EAGLE `prev_hidden`); the behaviour is base.py's."""

from transformers_neuronx import base
from transformers_neuronx.config import NeuronConfig


class MistralForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp="f32", tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=NeuronConfig(), **kwargs):  # noqa: B008 (the real default)
        self._init_model(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                         context_length_estimate=context_length_estimate, neuron_config=neuron_config,
                         model_type="mistral")

    def forward(self, input_ids, cache_ids=None, start_ids=None):
        return self._run(input_ids, cache_ids, start_ids)
