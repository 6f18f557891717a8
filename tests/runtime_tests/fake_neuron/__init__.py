"""Contract fakes of the AWS Neuron libraries, whose real packages install only on Neuron hosts: each enforces the
rules of the releases it mirrors (read in the library's source, cited per module) and computes real tokens with our
reference Llama-family model. Installed per test: `install.install_nxdi` (neuronx_distributed_inference),
`install_tnx.install_tnx` (transformers_neuronx).
"""
