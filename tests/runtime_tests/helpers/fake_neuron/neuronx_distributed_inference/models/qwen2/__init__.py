from neuronx_distributed_inference._release import at_least

if not at_least((0, 4)):  # models/qwen2 first ships in 0.4 (2c46add); MODEL_TYPES lists it from 0.5
    raise ModuleNotFoundError("No module named 'neuronx_distributed_inference.models.qwen2'",
                              name="neuronx_distributed_inference.models.qwen2")
