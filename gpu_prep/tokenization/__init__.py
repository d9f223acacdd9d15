"""tokenization (the tokenize stage): strings -> flat ids + offsets, by the fastest engine seen to equal HF tokenizers.

tokenizer.py  load_tokenizer and Tokenizer: the run's tokenizer, its chat template, special tokens, identity
engines.py    the engines (HF, fastokens, tiktoken), choose_engine and the Audit that checks them as a run goes
bundled.py    qwen2.5, qwen3 and bert-uncased built offline from installed packages, and the cache they live in
early.py      the fast engine's build, started by the console script before its imports

The modules are imported where used, not here: early.py must load without the others.
"""

__all__ = ["bundled", "early", "engines", "tokenizer"]
