"""A real byte-level BPE tokenizer for the tiny test models, built in-process.

The tiny models speak ids in [0, 768); this tokenizer gives those ids text, so that the
coordinator's text paths (chat template, incremental detokenization of multi-byte
characters, stop strings) run for real in tests without model files. It is trained
in-process on a small fixed corpus, so it is the same on every machine. Special tokens
mirror SmolLM2's: 0 <|endoftext|>, 1 <|im_start|>, 2 <|im_end|> (end of turn).
"""

from __future__ import annotations

import functools

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_CORPUS = """
Speculative decoding lets a small draft model propose several tokens and a large target
model check them all at once. The output follows the target model exactly, and it comes
out faster when the draft guesses well. A coordinator keeps what the target would have
produced and throws the rest away; the caches of both services follow the committed text.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs!
def generate(prompt, max_new_tokens=64):
    for i in range(max_new_tokens):
        yield {"token": i, "text": prompt[i:]}
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 3.14159 2026-11-29 12:30.
Café, naïve, façade, Straße, Ærø, smörgåsbord, jalapeño, crème brûlée.
你好，世界。 こんにちは。 안녕하세요. Привет, мир! Γειά σου κόσμε. مرحبا بالعالم
🙂 👍 🚀 ✨ — “quotes” ‘single’ … • → ≤ ≥ ≠ ∞ € £ ¥
"""


@functools.cache
def build(vocab_size: int):
    """A PreTrainedTokenizerFast with exactly `vocab_size` ids (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, min_frequency=1,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    lines = [line for line in _CORPUS.splitlines() if line]
    tok.train_from_iterator(lines * 4, trainer)
    # A small corpus may yield fewer merges than wanted: pad with inert tokens so that
    # every id the model can produce decodes to something.
    missing = vocab_size - tok.get_vocab_size()
    if missing > 0:
        tok.add_tokens([f"<unused{i}>" for i in range(missing)])
    assert tok.get_vocab_size() == vocab_size, tok.get_vocab_size()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>",
        unk_token=None, pad_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast
