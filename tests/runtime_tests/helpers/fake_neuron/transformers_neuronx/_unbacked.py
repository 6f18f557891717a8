"""Stand-ins for the TNx model classes the fake does not compute (it backs Llama and Mistral only), so that the
registry in modeling_auto.py lists what the real 0.13 one lists."""


def unbacked(name: str) -> type:
    def from_pretrained(cls, *args, **kwargs):
        raise NotImplementedError(f"the contract fake does not back transformers_neuronx {name}")

    return type(name, (), {"from_pretrained": classmethod(from_pretrained)})


BloomForSampling = unbacked("BloomForSampling")
GPT2ForSamplingWithContextBroadcasting = unbacked("GPT2ForSamplingWithContextBroadcasting")
GPTNeoXForSampling = unbacked("GPTNeoXForSampling")
GPTJForSampling = unbacked("GPTJForSampling")
MixtralForSampling = unbacked("MixtralForSampling")
OPTForSampling = unbacked("OPTForSampling")
