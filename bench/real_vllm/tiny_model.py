"""Build the tiny random-weight Llama and its byte-level BPE tokenizer. Issue 9.

Runs inside the vLLM virtualenv (it needs torch, transformers and tokenizers); nothing is
downloaded. The weights are random, so the text is noise, but the engine does the real work:
a few million parameters make the per-token (beta) and per-KV-token (gamma) costs measurable
next to the fixed per-iteration cost (alpha).
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path

VOCAB_SIZE = 4096
HIDDEN_SIZE = 384
INTERMEDIATE_SIZE = 1024
NUM_LAYERS = 4
NUM_HEADS = 6  # head_dim 64, a size the CPU attention kernels support
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<pad>")
SEED = 20261201
# Caps how much text the tokenizer trains on: enough for merges, quick on two cores.
MAX_TRAINING_FILES = 400
STAMP_NAME = "vllm-sizer-model.json"


def training_text_files() -> list[str]:
    """Local text to train the tokenizer on: the Python standard library's own sources."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(str(p) for p in stdlib.glob("*.py"))
    return files[:MAX_TRAINING_FILES]


def build_tokenizer(out_dir: Path) -> None:
    """Train a byte-level BPE tokenizer and save it in the transformers layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train(training_text_files(), trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    fast.save_pretrained(out_dir)


def build_model(out_dir: Path) -> int:
    """Save a random-weight LlamaForCausalLM; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=3,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    """CLI: build into OUT_DIR unless its stamp says it is already built."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    stamp = out_dir / STAMP_NAME
    if stamp.exists():
        print(f"model cached: {out_dir}")
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out_dir)
    params = build_model(out_dir)
    stamp.write_text(json.dumps({"parameters": params, "vocab_size": VOCAB_SIZE,
                                 "hidden_size": HIDDEN_SIZE, "layers": NUM_LAYERS}))
    print(f"model built: {out_dir} ({params / 1e6:.1f} M parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
