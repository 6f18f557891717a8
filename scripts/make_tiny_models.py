"""Make the tiny test models: a 4-layer Llama target and a 1-layer draft distilled from it.

Both are trained from scratch on a small corpus of CPython standard-library docstrings, committed as
``scripts/assets/corpus.jsonl.gz`` so that the result does not depend on the Python version
(``--regenerate-corpus`` rebuilds it from the running interpreter's stdlib). Everything is seeded and
training runs a fixed number of steps, so a rerun with the same torch build gives the same weights.

Steps:
  1. split the corpus 95/5 by a hash of each name; format every record as a ChatML turn or as
     plain text (50/50, also by hash);
  2. train a byte-level BPE tokenizer (vocab 4096; <|endoftext|>=0, <|im_start|>=1, <|im_end|>=2);
  3. train the target (cross-entropy), then distil the draft from it (KL to the target's
     next-token distribution; this gave 33% acceptance against 27% for an even CE/KL mix);
  4. measure validation perplexity and greedy draft acceptance at k=4 with a plain
     draft-then-verify loop in fp32;
  5. write Hugging Face folders ``target/`` and ``draft/`` (fp32 safetensors, shared tokenizer,
     ChatML chat template, generation_config eos [2, 0]) and ``metadata.json``, then reload them.

Output: tests/assets/tiny/{target,draft,metadata.json}. About 10 minutes on 2 CPU cores.
Usage: python scripts/make_tiny_models.py [--regenerate-corpus] [--out DIR] [--target-steps N] [--draft-steps N]
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import io
import json
import math
import os
import platform
import sys
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning. On a shared, busy machine spinning made each
# training step 3-7x slower; the numerics do not change. Must be set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import tokenizers  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

from fetch_default_model import add_transformers4_keys  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CORPUS_PATH = REPO / "scripts" / "assets" / "corpus.jsonl.gz"
DEFAULT_OUT = REPO / "tests" / "assets" / "tiny"

SEED = 1234
THREADS = 2
VOCAB_SIZE = 4096
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]  # ids 0, 1, 2
EOS_TOKEN_IDS = [2, 0]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MIN_DOC_CHARS = 40
SKIPPED_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "__pycache__"}
VAL_PERCENT = 5
MAX_POSITIONS = 1024

SPEC_K = 4
SPEC_PROMPTS = 20
SPEC_MAX_NEW = 32
PLAIN_PROMPT_TOKENS = 12


@dataclass(frozen=True)
class TrainSpec:
    layers: int
    steps: int
    seed: int
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    weight_decay: float = 0.1
    clip: float = 1.0
    kd_alpha: float = 1.0  # with a teacher: weight of cross-entropy, the rest on KL(teacher || student)


def log(message: str) -> None:
    print(f"[make_tiny_models] {message}", flush=True)


# ----------------------------------------------------------------------------- corpus


def module_name(path: Path, stdlib: Path) -> str:
    parts = list(path.relative_to(stdlib).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def docstrings_of(tree: ast.Module, prefix: str):
    """Yield (qualified name, docstring) for the module and every class and function in it."""
    doc = ast.get_docstring(tree)
    if doc:
        yield prefix, doc
    stack = [(node, prefix) for node in tree.body]
    while stack:
        node, parent = stack.pop(0)
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{parent}.{node.name}"
            doc = ast.get_docstring(node)
            if doc:
                yield name, doc
            stack.extend((child, name) for child in node.body)


def collect_corpus() -> list[dict]:
    """Docstrings (>= 40 characters) of the running interpreter's standard library, sorted by name."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    records = {}
    for path in sorted(stdlib.rglob("*.py")):
        if SKIPPED_DIRS.intersection(path.relative_to(stdlib).parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for name, doc in docstrings_of(tree, module_name(path, stdlib)):
            if len(doc) >= MIN_DOC_CHARS:
                records.setdefault(name, doc)
    return [{"name": name, "doc": records[name]} for name in sorted(records)]


def write_corpus(records: list[dict], path: Path) -> None:
    """Write gzipped JSON lines with a fixed gzip header, so equal records give equal bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", filename="", mtime=0, compresslevel=9) as gz:
        for record in records:
            gz.write((json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n").encode("utf-8"))
    path.write_bytes(buffer.getvalue())


def read_corpus(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def name_hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")


def is_validation(record: dict) -> bool:
    return name_hash(record["name"]) % 100 < VAL_PERCENT


def chat_question(name: str) -> str:
    return f"What does {name} do?"


def format_record(record: dict) -> str:
    """A ChatML exchange (the chat template's exact output) or plain text, chosen by hash."""
    if (name_hash(record["name"]) >> 32) % 2 == 0:
        return (
            f"{IM_START}user\n{chat_question(record['name'])}{IM_END}\n"
            f"{IM_START}assistant\n{record['doc']}{IM_END}\n"
        )
    return record["doc"] + ENDOFTEXT


# ----------------------------------------------------------------------------- tokenizer


def train_tokenizer(records: list[dict]) -> PreTrainedTokenizerFast:
    """Byte-level BPE over the training docstrings and questions, wrapped for transformers."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = [text for r in records for text in (r["doc"], chat_question(r["name"]), "user\nassistant\n")]
    tokenizer.train_from_iterator(texts, trainer=trainer)
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2]
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=ENDOFTEXT,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
    )


def encode_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    encodings = tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False)
    return torch.tensor([i for encoding in encodings for i in encoding.ids], dtype=torch.long)


# ----------------------------------------------------------------------------- models and training


def make_model(layers: int, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=0,
        dtype=torch.float32,
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, spec: TrainSpec) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio × lr."""
    if step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    progress = (step - spec.warmup_steps) / max(1, spec.steps - spec.warmup_steps)
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def step_loss(model, batch: torch.Tensor, spec: TrainSpec, teacher=None) -> torch.Tensor:
    inputs, labels = batch[:, :-1], batch[:, 1:]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=inputs).logits.float()
        ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
        if teacher is None:
            return ce
        with torch.no_grad():
            teacher_logp = F.log_softmax(teacher(input_ids=inputs).logits.float(), dim=-1)
    kl = F.kl_div(F.log_softmax(logits, dim=-1), teacher_logp, log_target=True, reduction="none").sum(-1).mean()
    return spec.kd_alpha * ce + (1 - spec.kd_alpha) * kl


def train(model, stream: torch.Tensor, spec: TrainSpec, teacher=None) -> float:
    """Train for spec.steps on random windows of stream (bf16 autocast); return seconds taken."""
    generator = torch.Generator().manual_seed(spec.seed)
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices; not norms
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": spec.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=spec.lr,
        betas=(0.9, 0.95),
    )
    model.train()
    started = time.monotonic()
    for step in range(spec.steps):
        starts = torch.randint(0, len(stream) - spec.seq_len - 1, (spec.batch_size,), generator=generator)
        batch = torch.stack([stream[s : s + spec.seq_len + 1] for s in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, spec)
        loss = step_loss(model, batch, spec, teacher)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
        optimizer.step()
        if step % 50 == 0 or step == spec.steps - 1:
            elapsed = time.monotonic() - started
            log(f"  step {step + 1}/{spec.steps} loss {loss.item():.3f} ({elapsed:.0f} s)")
    model.eval()
    return time.monotonic() - started


@torch.no_grad()
def perplexity(model, stream: torch.Tensor, seq_len: int = 256) -> float:
    """fp32 perplexity over consecutive, non-overlapping windows of the validation stream."""
    total_nll, total_tokens = 0.0, 0
    for start in range(0, len(stream) - 1, seq_len):
        window = stream[start : start + seq_len + 1].unsqueeze(0)
        if window.size(1) < 2:
            break
        logits = model(input_ids=window[:, :-1]).logits
        total_nll += F.cross_entropy(logits[0], window[0, 1:], reduction="sum").item()
        total_tokens += window.size(1) - 1
    return math.exp(total_nll / total_tokens)


# ----------------------------------------------------------------------------- speculation check


def spec_prompts(tokenizer: PreTrainedTokenizerFast, val_records: list[dict]) -> list[list[int]]:
    """Held-out records spread over the corpus: alternately a chat question about the name and the
    first tokens of the docstring as plain text."""
    chosen = val_records[:: len(val_records) // SPEC_PROMPTS][:SPEC_PROMPTS]
    prompts = []
    for i, record in enumerate(chosen):
        if i % 2 == 0:
            messages = [{"role": "user", "content": chat_question(record["name"])}]
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        else:
            prompts.append(tokenizer(record["doc"], add_special_tokens=False)["input_ids"][:PLAIN_PROMPT_TOKENS])
    return prompts


@torch.no_grad()
def greedy_next(model, ids: list[int], count: int) -> list[int]:
    """Argmax tokens at the last `count` positions of ids (no KV cache: a full forward)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, -count:]
    return logits.argmax(-1).tolist()


def speculative_greedy(target, draft, prompt: list[int], k: int, max_new: int) -> tuple[list[int], int, int, int]:
    """Draft k tokens, verify them with one target call, keep the agreeing prefix plus the target's token.

    Returns (new tokens, accepted draft tokens, proposed draft tokens, target calls).
    """
    ids, new = list(prompt), []
    accepted = proposed = calls = 0
    while len(new) < max_new and not (new and new[-1] in EOS_TOKEN_IDS):
        proposal = []
        for _ in range(k):
            proposal += greedy_next(draft, ids + proposal, 1)
        verified = greedy_next(target, ids + proposal, k + 1)
        calls += 1
        n = 0
        while n < k and proposal[n] == verified[n]:
            n += 1
        accepted, proposed = accepted + n, proposed + k
        step = proposal[:n] + [verified[n]]
        for token in step:
            if len(new) == max_new or (new and new[-1] in EOS_TOKEN_IDS):
                break
            new.append(token)
        ids = list(prompt) + new
    return new, accepted, proposed, calls


def measure_acceptance(target, draft, prompts: list[list[int]]) -> dict:
    accepted = proposed = calls = tokens = identical = 0
    for prompt in prompts:
        new, a, p, c = speculative_greedy(target, draft, prompt, SPEC_K, SPEC_MAX_NEW)
        accepted, proposed, calls, tokens = accepted + a, proposed + p, calls + c, tokens + len(new)
        reference = target.generate(
            torch.tensor([prompt]), max_new_tokens=SPEC_MAX_NEW, do_sample=False, eos_token_id=EOS_TOKEN_IDS
        )[0, len(prompt):].tolist()
        identical += new == reference
    return {
        "k": SPEC_K,
        "prompts": len(prompts),
        "max_new_tokens": SPEC_MAX_NEW,
        "acceptance": round(accepted / proposed, 4),
        "tokens_per_target_call": round(tokens / calls, 3),
        "identical_to_target_generate": f"{identical}/{len(prompts)}",
    }


# ----------------------------------------------------------------------------- saving and checks


def save_folder(model, tokenizer: PreTrainedTokenizerFast, out: Path) -> None:
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=EOS_TOKEN_IDS, pad_token_id=0).save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)
    add_transformers4_keys(out)
    for path in out.iterdir():
        path.chmod(0o644)


def check_folder(folder: Path) -> None:
    """Reload a saved folder the ordinary way and check tokenizer, chat template and a forward pass."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert tokenizer.eos_token == IM_END and tokenizer.eos_token_id == 2, tokenizer.eos_token
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == [0, 1, 2]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What does os.path.join do?"}],
                                           add_generation_prompt=True, tokenize=False)
    assert prompt.endswith(f"{IM_START}assistant\n"), prompt
    assert len(tokenizer) == model.config.vocab_size == VOCAB_SIZE
    assert model.generation_config.eos_token_id == EOS_TOKEN_IDS
    model(input_ids=torch.tensor([[1, 2, 3]]))


def sha256_file(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_entry(model, spec: TrainSpec, seconds: float, val_ppl: float) -> dict:
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "train": asdict(spec) | {"tokens": spec.steps * spec.batch_size * spec.seq_len},
        "train_seconds": round(seconds, 1),
        "val_ppl": round(val_ppl, 2),
    }


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--regenerate-corpus", action="store_true",
                        help=f"rebuild {CORPUS_PATH.relative_to(REPO)} from this interpreter's stdlib first")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--target-steps", type=int, default=640)
    parser.add_argument("--draft-steps", type=int, default=256)
    args = parser.parse_args(argv)

    torch.set_num_threads(THREADS)
    if args.regenerate_corpus:
        write_corpus(collect_corpus(), CORPUS_PATH)
        log(f"wrote {CORPUS_PATH} from Python {platform.python_version()}")
    records = read_corpus(CORPUS_PATH)
    train_records = [r for r in records if not is_validation(r)]
    val_records = [r for r in records if is_validation(r)]

    tokenizer = train_tokenizer(train_records)
    train_stream = encode_stream(tokenizer, [format_record(r) for r in train_records])
    val_stream = encode_stream(tokenizer, [format_record(r) for r in val_records])
    log(f"corpus: {len(records)} docstrings, {len(train_stream)} train / {len(val_stream)} val tokens")

    target_spec = TrainSpec(layers=4, steps=args.target_steps, seed=SEED)
    draft_spec = TrainSpec(layers=1, steps=args.draft_steps, seed=SEED + 1, kd_alpha=0.0)
    log(f"training the target: {target_spec}")
    target = make_model(target_spec.layers, target_spec.seed)
    target_seconds = train(target, train_stream, target_spec)
    log(f"training the draft with distillation from the target: {draft_spec}")
    draft = make_model(draft_spec.layers, draft_spec.seed)
    draft_seconds = train(draft, train_stream, draft_spec, teacher=target)

    target_ppl, draft_ppl = perplexity(target, val_stream), perplexity(draft, val_stream)
    log(f"validation perplexity: target {target_ppl:.2f}, draft {draft_ppl:.2f}")
    speculation = measure_acceptance(target, draft, spec_prompts(tokenizer, val_records))
    log(f"greedy speculation: {speculation}")

    args.out.mkdir(parents=True, exist_ok=True)
    save_folder(target, tokenizer, args.out / "target")
    save_folder(draft, tokenizer, args.out / "draft")
    metadata = {
        "generator": "scripts/make_tiny_models.py",
        "corpus": {
            "path": str(CORPUS_PATH.relative_to(REPO)),
            "sha256": sha256_file(CORPUS_PATH),
            "docstrings": len(records),
            "train_tokens": len(train_stream),
            "val_tokens": len(val_stream),
        },
        "tokenizer": {"vocab_size": VOCAB_SIZE, "special_tokens": SPECIAL_TOKENS, "eos_token_ids": EOS_TOKEN_IDS},
        "target": model_entry(target, target_spec, target_seconds, target_ppl),
        "draft": model_entry(draft, draft_spec, draft_seconds, draft_ppl) | {"distilled_from": "target"},
        "speculation": speculation,
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "torch_threads": THREADS,
    }
    (args.out / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
    for name in ("target", "draft"):
        check_folder(args.out / name)
    log(f"wrote and checked {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
