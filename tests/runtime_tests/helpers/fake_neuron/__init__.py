"""Contract fakes of the AWS Neuron libraries, whose real packages install only on Neuron hosts. Each keeps the real
library's module paths and public names for what our runners use, enforces the rules of the releases it mirrors
(read in the library's source, cited per module) and computes real tokens with our reference Llama-family model:

- `neuronx_distributed_inference/`: NxDI, releases 0.3 to 0.10 (the fake branches per release through
  `_release.at_least`); its model families (llama, qwen2, mistral) are built by one factory, `models/_family.py`;
- `transformers_neuronx/`: transformers-neuronx 0.13.x; its device is `_backing.py`, and its fused draft and EAGLE
  decoders share `fused_speculation.FusedSpeculativeBase`.

Installed per test by `install.py`: `install_nxdi(monkeypatch, version, tmp_path)` and
`install_tnx(monkeypatch, tmp_path, version="0.13.798")` (`RELEASES`, `TNX_RELEASES`: the shipped versions), both
through one helper that writes the distribution's METADATA and links the package into a site folder of its own under
`tmp_path`, prepends it to sys.path and purges the fake's modules when the test ends. `tiny.py` is not a fake: the
committed tiny Llama the fakes' tests run on and transformers' greedy continuation on it.
"""
