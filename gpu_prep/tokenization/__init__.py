"""tokenization (the tokenize stage): strings -> flat ids + offsets, by the fastest engine seen to equal HF tokenizers.

tokenizer.py  load_tokenizer and Tokenizer: the run's tokenizer, its chat template, special tokens, identity
resolve.py    what a tokenizer spec names (a folder, a bundled tokenizer, a hub model id), its tokenizer_config.json
outline.py    what a run knows of a tokenizer before HF tokenizers has loaded it, kept in the user cache dir
engines.py    the engines (HF, fastokens, tiktoken) and the rank files fastokens builds from
builds.py     each fast engine built once per process, in a thread of its own
checks.py     choose_engine and the Audit: a fast engine is used only where it equals HF, checked as a run goes
bundled.py    qwen2.5, qwen3 and bert-uncased built offline from installed packages, and the cache they live in
early.py      the fast engine's build, started by the console script before its imports

The modules are imported where used, not here: early.py must load without the others.
"""

__all__ = ["builds", "bundled", "checks", "early", "engines", "outline", "resolve", "tokenizer"]
