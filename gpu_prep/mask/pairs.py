"""Preference pairs (input.type preference): a prompt, a chosen and a rejected completion, as TRL trains them.

A pair is rendered as prompt + chosen, prompt + rejected and the prompt alone (conversational: the prompt
as the chat template renders it with its generation prompt), each tokenized whole, as the SFT path
tokenizes a conversation. Here they are cut apart as TRL 1.x's DPO and KTO trainers cut them: the prompt
is the tokens the prompt alone shares with every whole sequence at its start (common_prefix_length), and
each completion is the rest of its sequence. So prompt + completion is always exactly the whole
sequence's tokenization, and the prompt may be shorter than the prompt tokenized alone: where the first
token of a completion takes in the prompt's last characters (a BPE merge across the boundary, counted as
prompt_merged) or where the template renders its generation prompt otherwise before a completion
(Gemma 4's empty thought channel, counted as generation_prompt_differs).

Limits, as TRL names them (PreprocessingConfig): max_prompt_length keeps the prompt's first or last tokens
(truncation_mode), max_completion_length a completion's first, and max_seq_len (max_length) cuts prompt +
completion at the completion's end; a pair whose prompt leaves no room for a completion token is dropped.
The output holds each pair as two samples, prompt + chosen then prompt + rejected, their masks 0 on the
prompt and 1 on the completion (bin; Parquet writes TRL's columns from them).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from gpu_prep.errors import Drop, Dropped
from gpu_prep.mask.project import Masked
from gpu_prep.ragged import offsets_from_lengths, row_of, segment_mins

# What meta.json says of a domain of pairs (its pair index is the samples' order).
PAIR_META = {
    "preference": {"pairs": "pair p is samples 2p (prompt + chosen) and 2p + 1 (prompt + rejected); a pair never "
                            "spans two shards, so num_samples / 2 pairs are in each",
                   "prompt": "the tokens before the first with loss_mask 1, the same in both samples of a pair",
                   "read": "gpu_prep.open_dataset(out)[domain].pairs() gives (prompt, chosen, rejected) token ids"},
    "kto": {"unpaired": "each sample is prompt + completion; sample_labels holds its label (1 desirable, 0 not)",
            "prompt": "the tokens before the first with loss_mask 1",
            "read": "gpu_prep.open_dataset(out)[domain].unpaired() gives (prompt, completion, label)"},
}
PAIR_COUNTS = ("prompt_merged", "generation_prompt_differs", "prompt_truncated", "completion_truncated")


def _shared(a: np.ndarray, b: np.ndarray) -> int:
    """How many tokens a and b share at their start."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def prompt_end(mask: np.ndarray) -> int:
    """The tokens before a sequence's first trained one."""
    trained = np.flatnonzero(mask)
    return int(trained[0]) if len(trained) else len(mask)


def sequence_tokens(tokens_per_piece: np.ndarray, pieces_per_row: np.ndarray, sequences: int) -> np.ndarray:
    """The tokens of each of the rows' sequences, `sequences` a row, each of as many of the row's pieces (a
    standard pair's prefix is a piece of its own, before each sequence's text)."""
    per_sequence = pieces_per_row // sequences
    if (per_sequence == 1).all():
        return tokens_per_piece
    return np.add.reduceat(tokens_per_piece, offsets_from_lengths(np, np.repeat(per_sequence, sequences))[:-1])


def cut_pairs(masked: Masked, tokens_per_piece: np.ndarray, rules: Any, num_rows: int, differs: np.ndarray,
              sides_per_row: int = 2) -> tuple[Masked, list[tuple[int, Dropped]], Counter, np.ndarray]:
    """Each kept row's sequences (pieces, untruncated in masked: a pair's two, an unpaired row's one, then
    the prompt alone) -> its samples, cut to TRL's limits. differs: per row, whether the template renders
    the generation prompt otherwise before a completion. Returns the samples (sides_per_row a kept row),
    the rows dropped here (row, why), the counts (PAIR_COUNTS) and the trained tokens of each
    row's spans (its completions as written)."""
    ids, offsets = masked.ids, masked.offsets
    counts: Counter = Counter()
    trained_by_span = np.zeros(sides_per_row * num_rows, np.int64)
    drops: list[tuple[int, Dropped]] = []
    out_ids, out_mask, lengths, kept, truncated = [], [], [], [], []
    per_row = sides_per_row + 1
    for k, r in enumerate(masked.kept_rows.tolist()):
        row_ids = ids[offsets[k]:offsets[k + 1]]
        cuts = np.cumsum([0, *tokens_per_piece[per_row * r:per_row * (r + 1)]])
        *sides, alone = (row_ids[a:b] for a, b in zip(cuts[:-1], cuts[1:]))
        shared = min(_shared(alone, s) for s in sides)  # TRL's common_prefix_length, the least of the sides'
        if min(map(len, sides)) == shared:
            drops.append((r, Dropped(Drop.NO_TRAINED_TOKENS, "a completion holds no token of its own")))
            continue
        if shared < len(alone):
            counts["generation_prompt_differs" if differs[r] else "prompt_merged"] += 1
        prompt = alone[:shared]
        completions = [s[shared:] for s in sides]
        cut = False
        if rules.max_prompt_length is not None and len(prompt) > rules.max_prompt_length:
            n = rules.max_prompt_length
            prompt = prompt[:n] if rules.truncation_mode == "keep_start" else prompt[len(prompt) - n:]
            counts["prompt_truncated"] += 1
            cut = True
        if rules.max_completion_length is not None and max(map(len, completions)) > rules.max_completion_length:
            completions = [c[:rules.max_completion_length] for c in completions]
            counts["completion_truncated"] += 1
            cut = True
        room = rules.max_seq_len - len(prompt)
        if max(map(len, completions)) > room:
            if room < 1 or rules.truncation in ("drop", "raise"):
                why = (f"the prompt's {len(prompt)} tokens leave no completion token within max_seq_len "
                       f"{rules.max_seq_len}") if room < 1 else f"over max_seq_len {rules.max_seq_len} tokens"
                drops.append((r, Dropped(Drop.TOO_MANY_TOKENS, why)))
                continue
            completions = [c[:room] for c in completions]
            counts["completion_truncated"] += 1
            cut = True
        trained_by_span[sides_per_row * r:sides_per_row * (r + 1)] = [len(c) for c in completions]
        for completion in completions:
            out_ids += [prompt, completion]
            out_mask += [np.zeros(len(prompt), np.int8), np.ones(len(completion), np.int8)]
            lengths.append(len(prompt) + len(completion))
        kept.append(r)
        truncated.append(cut)
    none = np.zeros(0, np.int64)
    samples = Masked(np.concatenate(out_ids).astype(np.int64) if out_ids else none,
                     np.concatenate(out_mask) if out_mask else np.zeros(0, np.int8),
                     offsets_from_lengths(np, np.asarray(lengths, np.int64)), np.asarray(kept, np.int64),
                     np.asarray(masked.no_trained_rows), np.asarray(kept, np.int64)[np.asarray(truncated, bool)])
    return samples, drops, counts, trained_by_span


def prompt_lengths(loss_mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """prompt_end of every sample at once (samples as offsets into loss_mask): the tokens before its first
    trained one, as a column operation."""
    total = int(offsets[-1])
    sample = row_of(np, offsets, total)
    position = np.arange(total) - offsets[:-1][sample]
    never = np.iinfo(np.int64).max
    first = segment_mins(np, np.where(loss_mask[:total] != 0, position, never), offsets, never)
    return np.minimum(first, np.diff(offsets))


def cut_samples(ids: np.ndarray, offsets: np.ndarray, cuts: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each sample cut in two after its first cuts[k] tokens: the heads (flat ids, offsets), then the tails."""
    total = int(offsets[-1])
    sample = row_of(np, offsets, total)
    head = np.arange(total) - offsets[:-1][sample] < cuts[sample]
    return (ids[:total][head], offsets_from_lengths(np, cuts), ids[:total][~head],
            offsets_from_lengths(np, np.diff(offsets) - cuts))
