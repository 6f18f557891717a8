"""The NeuronModel Kubernetes operator (kopf). Built in the operator issue; see DESIGN.md."""
