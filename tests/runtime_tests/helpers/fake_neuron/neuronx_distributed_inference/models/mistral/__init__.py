from neuronx_distributed_inference._release import at_least

if not at_least((0, 9)):  # models/mistral and MODEL_TYPES["mistral"] first appear at ef2731e (0.9)
    raise ModuleNotFoundError("No module named 'neuronx_distributed_inference.models.mistral'",
                              name="neuronx_distributed_inference.models.mistral")
