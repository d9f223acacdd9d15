"""Packed output in the trainers users have: the README's recipes (Into a trainer), run as written on
gpu-prep's packed Parquet with the installed transformers and TRL, keep every sample to itself.

"Keeps to itself" is measured, not assumed: a small random Llama runs the batch a recipe makes, and each
sample's logits must equal those of the sample run alone (a sample that attends to its neighbours differs
by about 0.1; float noise is below 1e-5). The recipes' code is taken from README.md, so the README cannot
drift from what was tested. Without torch (the plain test install) only the column checks run; CI installs
torch and TRL in a second step and runs this file again.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import gpu_prep
from helpers import REPO, run_rows

ISOLATED, LEAKED = 1e-4, 1e-3  # max |packed - alone| logits of an isolated sample; the least a leak shows

WORDS = "the a model token data packed sample row loss mask train attention boundary short long".split()


def _chats(count: int) -> list[dict[str, Any]]:
    rng = random.Random(7)
    say = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    return [{"messages": [{"role": "user", "content": f"{i}: {say(rng.randint(3, 25))}?"},
                          {"role": "assistant", "content": say(rng.randint(3, 40))}]} for i in range(count)]


def _config(packing: str) -> dict[str, Any]:
    return {"version": 1, "tokenizer": "qwen2.5", "input": {"type": "chat"}, "mask": {"assistant": "train"},
            "preprocessing": {"max_seq_len": 160, "packing": packing}, "output": {"storage_format": "parquet"}}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 40 conversations, packed best-fit-decreasing and unpacked."""
    tmp = tmp_path_factory.mktemp("trainers")
    rows = _chats(40)
    return {p: run_rows(tmp, _config(p), rows, name=p) for p in ("bfd", "none")}


def _files(out: Path) -> list[str]:
    meta = gpu_prep.open(out)["__default__"]
    return [str(out / "__default__" / shard["files"]["parquet"]) for shard in meta.meta["shards"]]


def _rows(out: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return [row for path in _files(out) for row in pq.read_table(path).to_pylist()]


def _recipe(name: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.findall(rf"```python\n# recipe: {name}\n(.*?)```", text, re.S)
    assert len(found) == 1, f"README.md has {len(found)} recipes named {name!r}"
    return found[0]


# ---------------------------------------------------------------- the columns (no torch needed)


def test_packed_rows_carry_seq_lengths_that_agree_with_position_ids(outputs: dict[str, Path]) -> None:
    rows = _rows(outputs["bfd"])
    assert any(len(row["seq_lengths"]) > 1 for row in rows)  # the corpus really packs
    for row in rows:
        assert sum(row["seq_lengths"]) == len(row["input_ids"])
        assert row["position_ids"] == [p for n in row["seq_lengths"] for p in range(n)]
    # the samples cut out by seq_lengths are exactly the unpacked run's samples
    packed = sorted(tuple(ids) for row in rows for ids in np.split(np.array(row["input_ids"]),
                                                                  np.cumsum(row["seq_lengths"])[:-1]))
    unpacked = sorted(tuple(row["input_ids"]) for row in _rows(outputs["none"]))
    assert packed == unpacked and len(unpacked) == 40


def test_meta_json_lets_each_shard_memory_map_from_its_own_entry(tmp_path: Path) -> None:
    """A domain of several shards: np.memmap with each shard entry's shape and dtype reads that shard."""
    config = {**_config("none"), "output": {"storage_format": "bin", "max_tokens_per_shard": 300}}
    out = run_rows(tmp_path, config, _chats(40))
    domain = gpu_prep.open(out)["__default__"]
    shards = domain.meta["shards"]
    assert len(shards) > 2
    for k, shard in enumerate(shards):
        for array in ("sequence", "loss_mask", "sample_offsets"):
            entry = shard[array]
            mapped = np.memmap(out / "__default__" / shard["files"][array], dtype=entry["dtype"], mode="r",
                               shape=tuple(entry["shape"]))
            arrays = domain.shard(k)
            assert np.array_equal(mapped, {"sequence": arrays.sequence, "loss_mask": arrays.loss_mask,
                                           "sample_offsets": arrays.offsets}[array])
    assert sum(s["sequence"]["shape"][0] for s in shards) == domain.meta["sequence"]["shape"][0]


def test_the_llamafactory_recipe_writes_a_folder_load_from_disk_reads_as_its_train_split(
        outputs: dict[str, Path], tmp_path: Path) -> None:
    """LLaMA-Factory's tokenized_path: load_from_disk must give a DatasetDict whose train split holds the rows
    of unpacked output with the columns its collator pads (input_ids, attention_mask, labels)."""
    from datasets import DatasetDict, load_from_disk

    tokenized = str(tmp_path / "tokenized")
    exec(_recipe("llamafactory"), {"files": _files(outputs["none"]), "tokenized": tokenized})  # noqa: S102
    loaded = load_from_disk(tokenized)
    assert isinstance(loaded, DatasetDict) and list(loaded) == ["train"]
    assert {"input_ids", "attention_mask", "labels"} <= set(loaded["train"].column_names)
    assert loaded["train"].to_list() == _rows(outputs["none"])


# ---------------------------------------------------------------- the recipes, with torch


@pytest.fixture(scope="module")
def torch() -> Any:
    return pytest.importorskip("torch")


@pytest.fixture
def model(torch: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=151_665, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).eval()


def _leak(model: Any, torch: Any, batch: dict[str, Any], samples: list[list[int]]) -> float:
    """The largest difference between each sample's logits inside the batch and alone."""
    inputs = {k: batch[k] for k in ("input_ids", "position_ids", "attention_mask") if batch.get(k) is not None}
    with torch.no_grad():
        logits = model(**inputs, use_cache=False).logits.reshape(-1, model.config.vocab_size)
        worst, at = 0.0, 0
        for sample in samples:
            alone = model(input_ids=torch.tensor([sample]), use_cache=False).logits[0]
            worst = max(worst, float((logits[at:at + len(sample)] - alone).abs().max()))
            at += len(sample)
    return worst


def _samples(rows: list[dict[str, Any]]) -> list[list[int]]:
    out = []
    for row in rows:
        at = 0
        for n in row["seq_lengths"]:
            out.append(row["input_ids"][at:at + n])
            at += n
    return out


def _recorder(model: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.update(kwargs), with_kwargs=True)
    return seen


def _segments(positions: Any) -> list[int]:
    """The lengths of the runs that start wherever position_ids is 0."""
    flat = positions.reshape(-1).tolist()
    starts = [i for i, p in enumerate(flat) if p == 0] + [len(flat)]
    return [b - a for a, b in zip(starts, starts[1:])]


def test_the_collator_recipe_keeps_every_sample_to_itself(outputs: dict[str, Path], model: Any, torch: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(_recipe("collator"), namespace)  # noqa: S102  the README's own code
    rows = [row for row in _rows(outputs["bfd"]) if len(row["seq_lengths"]) > 1][:3]
    batch = namespace["collate_packed"](rows)
    assert batch["labels"][batch["position_ids"] == 0].eq(-100).all()
    assert _leak(model, torch, batch, _samples(rows)) < ISOLATED
    # the control: the same rows with positions counted per row (what loses the boundaries) do leak
    plain = {"input_ids": batch["input_ids"], "position_ids": torch.arange(batch["input_ids"].shape[1])[None]}
    assert _leak(model, torch, plain, _samples(rows)) > LEAKED


def test_trainer_with_the_collator_recipe_hands_the_model_the_boundaries(outputs: dict[str, Path], model: Any,
                                                                          torch: Any, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from datasets import load_dataset
    from transformers import Trainer, TrainingArguments

    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {}
    exec(_recipe("collator"), namespace)  # noqa: S102
    train = load_dataset("parquet", data_files=_files(outputs["bfd"]), split="train").select(range(4))
    seen = _recorder(model)
    args = TrainingArguments(output_dir="checkpoints", max_steps=1, per_device_train_batch_size=4, use_cpu=True,
                             report_to=[], save_strategy="no", logging_strategy="no")
    Trainer(model=model, args=args, train_dataset=train, data_collator=namespace["collate_packed"]).train()
    assert seen.get("attention_mask") is None
    assert sorted(_segments(seen["position_ids"])) == sorted(n for row in train for n in row["seq_lengths"])


def test_trl_padding_free_recipe_keeps_every_sample_to_itself(outputs: dict[str, Path], model: Any, torch: Any,
                                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trl = pytest.importorskip("trl")
    monkeypatch.chdir(tmp_path)
    files, rows = _files(outputs["bfd"]), _rows(outputs["bfd"])
    real = trl.SFTConfig

    def one_step(**kwargs: Any) -> Any:  # the recipe's settings, plus one CPU step in full precision
        return real(**kwargs, max_steps=1, per_device_train_batch_size=len(rows), use_cpu=True, bf16=False,
                    report_to=[], save_strategy="no", logging_strategy="no")

    monkeypatch.setattr(trl, "SFTConfig", one_step)
    seen = _recorder(model)
    namespace: dict[str, Any] = {"files": files, "out_dir": str(outputs["bfd"]), "model": model}
    exec(_recipe("trl"), namespace)  # noqa: S102
    namespace["trainer"].train()
    assert seen.get("attention_mask") is None
    assert sorted(_segments(seen["position_ids"])) == sorted(n for row in rows for n in row["seq_lengths"])
    model.eval()
    flat = seen["input_ids"].reshape(-1).tolist()
    by_segment, at = [], 0
    for n in _segments(seen["position_ids"]):
        by_segment.append(flat[at:at + n])
        at += n
    assert _leak(model, torch, {"input_ids": seen["input_ids"], "position_ids": seen["position_ids"]},
                 by_segment) < ISOLATED


def test_the_flattening_recipe_is_for_unpacked_rows_only(outputs: dict[str, Path], model: Any, torch: Any) -> None:
    namespace: dict[str, Any] = {}
    exec(_recipe("flattening"), namespace)  # noqa: S102
    collator = namespace["collator"]
    unpacked = _rows(outputs["none"])[:6]
    batch = collator([{"input_ids": r["input_ids"], "labels": r["labels"]} for r in unpacked])
    assert _leak(model, torch, batch, [r["input_ids"] for r in unpacked]) < ISOLATED
    # packed rows: it numbers positions per row, whatever their position_ids say, and the samples leak
    packed = [row for row in _rows(outputs["bfd"]) if len(row["seq_lengths"]) > 1][:2]
    batch = collator([{k: r[k] for k in ("input_ids", "labels", "position_ids")} for r in packed])
    assert _segments(batch["position_ids"]) == [len(r["input_ids"]) for r in packed]
    assert _leak(model, torch, batch, _samples(packed)) > LEAKED


def _one_step_recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: Any, kind: str, rows: list[dict],
                     recipe: str, config_name: str) -> tuple[Any, list[dict[str, Any]]]:
    """gpu-prep's Parquet of these rows (input.type kind), and the trainer the README's recipe makes on it,
    set to one CPU step over one batch of them all: (the trainer, the rows as written)."""
    trl = pytest.importorskip("trl")
    import pyarrow.parquet as pq

    monkeypatch.chdir(tmp_path)
    config = {"tokenizer": "qwen2.5", "input": {"type": kind}, "output": {"storage_format": "parquet"}}
    out = run_rows(tmp_path, config, rows, name=kind)
    files = [str(p) for p in sorted((out / "__default__").glob("*.parquet"))]
    written = [r for f in files for r in pq.read_table(f).to_pylist()]
    real = getattr(trl, config_name)

    def one_step(**kwargs: Any) -> Any:
        return real(**kwargs, max_steps=1, per_device_train_batch_size=len(written), use_cpu=True, bf16=False,
                    report_to=[], save_strategy="no", logging_strategy="no")

    monkeypatch.setattr(trl, config_name, one_step)
    model.save_pretrained(tmp_path / "tiny")  # a path, as users pass one: TRL loads its reference model from it
    namespace: dict[str, Any] = {"files": files, "out_dir": str(out), "model": str(tmp_path / "tiny")}
    exec(_recipe(recipe), namespace)  # noqa: S102  the README's own code
    return namespace["trainer"], written


def test_the_dpo_recipe_trains_on_the_pairs_as_written(model: Any, torch: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # TRL's DPOTrainer, one step, on gpu-prep's pairs: the sequences the model sees are prompt + chosen and
    # prompt + rejected exactly as written, and the loss covers the completions alone.
    rows = [{"prompt": c["messages"][:1], "chosen": c["messages"][1:],
             "rejected": [{"role": "assistant", "content": "no"}]} for c in _chats(8)]
    trainer, pairs = _one_step_recipe(tmp_path, monkeypatch, model, "preference", rows, "dpo", "DPOConfig")
    seen = _recorder(trainer.model)
    trainer.train()
    ids, mask = seen["input_ids"], seen["attention_mask"]
    got = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    want = [p["prompt_ids"] + p["chosen_ids"] for p in pairs] + [p["prompt_ids"] + p["rejected_ids"] for p in pairs]
    assert sorted(got) == sorted(want)


def test_the_kto_recipe_trains_on_the_rows_as_written(model: Any, torch: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # TRL's KTOTrainer, one step, on gpu-prep's unpaired rows: the policy sees each prompt + completion as
    # written, and for the KL term each prompt with the completion before it in the batch.
    rows = [{"prompt": c["messages"][:1], "completion": c["messages"][1:], "label": k % 2 == 0}
            for k, c in enumerate(_chats(6))]
    trainer, written = _one_step_recipe(tmp_path, monkeypatch, model, "kto", rows, "kto", "KTOConfig")
    calls: list[dict[str, Any]] = []
    trainer.model.register_forward_pre_hook(lambda _m, _a, kwargs: calls.append(kwargs), with_kwargs=True)
    trainer.train()
    seen = {tuple(row[m.bool()].tolist()) for call in calls
            for row, m in zip(call["input_ids"], call["attention_mask"])}
    matched = {tuple(r["prompt_ids"] + r["completion_ids"]) for r in written}
    mismatched = {tuple(r["prompt_ids"] + written[k - 1]["completion_ids"]) for k, r in enumerate(written)}
    assert trainer.calculate_KL and matched | mismatched == seen
    assert len(matched) == len(written) == len(rows)
