"""What the runtime tests share: fake engines and servers, a fake Hugging Face Hub, the contract fakes of the
Neuron libraries (fake_neuron), and runner helpers."""
