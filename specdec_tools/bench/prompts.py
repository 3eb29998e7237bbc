"""The fixed benchmark prompts: varied tasks, so acceptance is not one lucky number."""

from __future__ import annotations

PARAGRAPH = (
    "The Great Barrier Reef, off the coast of Queensland, Australia, is the world's largest "
    "coral reef system. It is composed of over 2,900 individual reefs and 900 islands "
    "stretching over 2,300 kilometres. The reef is home to thousands of species, but rising "
    "sea temperatures have caused several mass bleaching events since 1998."
)
INVOICE = (
    "Invoice #4471 from Northwind Traders, dated 12 March 2025, to Contoso Ltd. Items: 3 "
    "ergonomic chairs at 189.00 EUR each, 1 standing desk at 540.00 EUR. Payment due within "
    "30 days to IBAN DE89 3704 0044 0532 0130 00."
)

# (name, user message)
PROMPTS: list[tuple[str, str]] = [
    ("chat", "Hi! Can you recommend a good way to spend a rainy Sunday afternoon?"),
    ("explanation", "Explain in a few sentences why the sky is blue."),
    ("code", "Write a Python function that checks whether a number is prime."),
    ("summarisation", f"Summarise this paragraph in two sentences:\n\n{PARAGRAPH}"),
    ("extraction", f"From this text, list the invoice number, the date and the total "
                   f"amount:\n\n{INVOICE}"),
    ("list", "List five tips for a good night's sleep."),
    ("translation", "Translate into French: 'The weather is lovely today, let's go for a "
                    "walk in the park.'"),
    ("continuation", "Continue this story: Once upon a time, in a small village by the sea, "
                     "there lived an old fisherman who"),
]

QUICK = ["explanation", "code"]


def chat_text(tokenizer, message: str) -> str:
    """A user message as the model sees it: the chat template applied once, with the
    assistant's turn opened (what every in-process peer feeds)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                         tokenize=False, add_generation_prompt=True)
