"""Mirrors the interface of src/transformers_neuronx/llama/model.py (0.13.x, 1ade6d7): `LlamaForSampling`'s
constructor arguments and `forward(input_ids, cache_ids=None, start_ids=None, last_token_id=None,
input_embeddings=None, **kwargs)` (`prev_hidden=` feeds an EAGLE draft); the behaviour is base.py's."""

from transformers_neuronx import base


class LlamaForSampling(base.NeuronModelBase):

    def __init__(self, config, *, n_positions=2048, batch_size=1, amp="f32", tp_degree=2,
                 context_length_estimate=None, context_unroll=None, unroll=None,
                 neuron_config=None, prefixed_length=0, **kwargs):
        # **kwargs are swallowed, as the real constructor does (from_pretrained passes everything through)
        self._init_model(config, n_positions=n_positions, batch_size=batch_size, amp=amp, tp_degree=tp_degree,
                         context_length_estimate=context_length_estimate, neuron_config=neuron_config,
                         model_type="llama")
        self.prefixed_length = prefixed_length

    def forward(self, input_ids, cache_ids=None, start_ids=None, last_token_id=None, input_embeddings=None,
                **kwargs):
        if last_token_id is not None or input_embeddings is not None:
            raise NotImplementedError("the contract fake does not model pre-embedded inputs")
        return self._run(input_ids, cache_ids, start_ids, kwargs.get("prev_hidden"))
