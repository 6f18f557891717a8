"""On-device generation with the rules of src/transformers_neuronx/layers/generation.py and hlo.py (0.13.x, 1ade6d7).

`generate` (per_batch_line, dynamic):
1. logits past the model's vocabulary are masked;
2. global top-k over the vocabulary (`hlo.topk`, sorted descending), when `global_top_k` is set (which requires
   `dynamic`);
3. per batch line, with the parameters of that line's *sequence id* (`sampling_params_for_batch_line` indexes the
   top_k / top_p / temperature / top_p_min_tokens tensors by `seq_ids`, i.e. the KV line): divide by the
   temperature, keep the first top_k positions (`hlo.topk_masked`, others set to -30000), then top-p (`hlo.topp`):
   softmax, cumulative sum, keep the positions whose cumulative probability is < top_p *plus the one that crosses it*
   (positions <= max(top_p_min_tokens - 1, count(cum < top_p))), others -30000;
4. softmax, and `hlo.multinomial`: the index is the number of normalised cumulative probabilities below one uniform
   draw (0.5 when `deterministic`).
Without `dynamic` and `do_sample` the model takes the argmax. The device's random source is one module-level
generator here (`GENERATOR`), so tests can seed it.
"""

from typing import List, Optional, Sequence, Tuple

import torch

from transformers_neuronx.config import GenerationConfig

#: The fake device's random source (hlo.random_uniform).
GENERATOR = torch.Generator().manual_seed(0)
MASKED = -30000.0


def uniform(n: int, deterministic: bool = False) -> torch.Tensor:
    if deterministic:
        return torch.full((n,), 0.5)
    return torch.rand(n, generator=GENERATOR)


class DeviceGeneration:
    """One compiled model's on-device generation: its GenerationConfig and, when dynamic, the per-line device tensors
    that `update_generation_config` rewrites (decoder.py: top_k / top_p_min_tokens int32, top_p / temperature
    float32)."""

    def __init__(self, config: GenerationConfig, batch_size: int, vocab_size: int):
        if config.global_top_k is not None:
            assert config.dynamic is True, "Dynamic on device generation must be enabled when global_top_k is set."
            if config.global_top_k > vocab_size:  # hlo.topk over the vocabulary: k cannot exceed it
                raise ValueError(f"global_top_k {config.global_top_k} exceeds the vocabulary ({vocab_size})")
        self.config = config
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.top_k = self.top_p = self.temperature = self.top_p_min_tokens = None
        if config.dynamic:
            self.write(config)

    def write(self, config: GenerationConfig) -> None:
        self.top_k = torch.tensor(config.top_k, dtype=torch.int32)
        self.top_p = torch.tensor(config.top_p, dtype=torch.float32)
        self.temperature = torch.tensor(config.temperature, dtype=torch.float32)
        self.top_p_min_tokens = torch.tensor(config.top_p_min_tokens, dtype=torch.int32)

    def _line_params(self, line: int) -> Tuple[int, float, float, int]:
        if self.config.dynamic:
            tensors = (self.top_k, self.top_p, self.temperature, self.top_p_min_tokens)
        else:
            c = self.config
            tensors = tuple(torch.tensor(v) for v in (c.top_k, c.top_p, c.temperature, c.top_p_min_tokens))
        values = [t.reshape(-1)[line if t.dim() and t.numel() > 1 else 0] for t in tensors]
        return int(values[0]), float(values[1]), float(values[2]), int(values[3])

    def candidates(self, logits: torch.Tensor, lines: Sequence[int]) -> List[Tuple[torch.Tensor, torch.Tensor]]:
        """Per row: (probabilities, token ids) of the filtered candidates, sorted by descending logit; row i uses
        the parameters of KV line `lines[i]`."""
        logits = logits.float()[:, : self.vocab_size]
        c = self.config
        if not c.dynamic and not c.do_sample:  # greedy_search
            ids = logits.argmax(dim=-1)
            return [(torch.ones(1), ids[i : i + 1]) for i in range(len(lines))]
        if c.global_top_k is not None:
            values, indices = torch.topk(logits, c.global_top_k, dim=-1)
        else:
            values, indices = torch.sort(logits, dim=-1, descending=True)
        out = []
        for i, line in enumerate(lines):
            top_k, top_p, temperature, min_tokens = self._line_params(line)
            v = values[i] / temperature
            positions = torch.arange(v.shape[0])
            v = torch.where(positions < top_k, v, torch.full_like(v, MASKED))  # topk_masked
            cumulative = torch.cumsum(torch.softmax(v, dim=-1), dim=-1)  # topp
            limit = max(min_tokens - 1, int((cumulative < top_p).sum()))
            v = torch.where(positions <= limit, v, torch.full_like(v, MASKED))
            out.append((torch.softmax(v, dim=-1), indices[i]))
        return out

    def sample(self, logits: torch.Tensor, lines: Sequence[int]) -> torch.Tensor:
        """`[N]` int32 tokens of `[N, V]` logits, row i with line `lines[i]`'s parameters."""
        picked = [int(ids[multinomial(probs, self.config.deterministic)])
                  for probs, ids in self.candidates(logits, lines)]
        return torch.tensor(picked, dtype=torch.int32)


def multinomial(probs: torch.Tensor, deterministic: bool = False, u: Optional[float] = None) -> int:
    """hlo.multinomial over descending-sorted probabilities: count of normalised cumulative values below u."""
    cumulative = torch.cumsum(probs, dim=-1)
    cumulative = cumulative / cumulative[-1]
    draw = float(uniform(1, deterministic)[0]) if u is None else u
    return min(int((draw > cumulative).sum()), probs.shape[0] - 1)
