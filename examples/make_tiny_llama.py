"""Build the bundled checkpoint ``examples/tiny_llama``: a random-weight Llama
(transformers, seed 0) with a byte-level BPE tokenizer trained on this file's
docstrings, so ``mdsl-run`` runs offline on a fresh clone.

    python examples/make_tiny_llama.py [OUT_DIR]

It needs ``torch`` and ``transformers`` (the ``test`` extra); the result is
committed, so running the example does not.
"""

import sys
from pathlib import Path

TEXT = __doc__ * 4 + """
modeldsl is a compiler toolchain for neural networks in the style of MLIR. Engineers
write a model once in the Module DSL; modeldsl parses it, lowers it, runs passes and
executes the result on the CPU or on NVIDIA GPUs. Hello, world! The quick brown fox
jumps over the lazy dog. 0123456789
"""


def build_tokenizer(out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<s>", "</s>"])
    tokenizer.train_from_iterator([TEXT], trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def main(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    vocab = build_tokenizer(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         bos_token_id=0, eos_token_id=1, tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(out)
    print(f"wrote {out} (vocab {vocab})")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent / "tiny_llama")
