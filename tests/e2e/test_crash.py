"""A run killed with SIGKILL anywhere leaves no file that looks complete, and --resume finishes it byte for
byte as the uninterrupted run does.

Each case runs the installed `gpu-prep` in a subprocess with GPU_PREP_FAILPOINT set, so that the process
kills itself the n-th time it passes a named point (gpu_prep/failpoint.py): while reading, tokenizing,
between the arrays of one shard, between the renames that close a shard, while writing rejects, around a
checkpoint, while writing meta.json and before the manifest. The run is then resumed and every file of
the output, and the rejects file, compared with an uninterrupted run's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_prep.config import parse_config
from gpu_prep.pipeline import MANIFEST, Options, run
from helpers import REPO, gpu_prep_cli, output_tree

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

CONFIG = {"input": {"type": "chat"}, "mask": {"assistant": "train"},
          "preprocessing": {"max_seq_len": 256},
          "output": {"domain_key": "source", "max_tokens_per_shard": 4000}}
CHUNK_ROWS = 40

# (failpoint, n-th pass, storage format, checkpoint every N seconds)
CASES = [
    ("read", 1, "bin", 0),  # before anything is written
    ("read", 8, "bin", 0),
    ("tokenize", 3, "bin", 0),
    ("tokenize", 9, "bin", 3600),  # no checkpoint yet: resume starts again from the beginning
    ("shard_append", 4, "bin", 0),  # one array of a shard written, the others not
    ("shard_append", 30, "h5", 0),
    ("shard_close", 1, "bin", 0),  # some files of a shard renamed into place, the others not
    ("shard_close", 8, "bin", 0),
    ("shard_close", 2, "h5", 0),
    ("rejects", 3, "bin", 0),
    ("checkpoint", 4, "bin", 0),  # data flushed, checkpoint not yet replaced
    ("checkpoint_written", 6, "h5", 0),
    ("meta", 2, "bin", 0),  # the run's end: some domains' meta.json written
    ("manifest", 1, "bin", 0),
    ("shard_close", 3, "bin-bfd", 0),  # a packed shard built under temporary names, its raw arrays still there
    ("shard_append", 12, "parquet-bfd", 0),
    ("shard_close", 2, "parquet-wrapped", 0),
    ("shard_close", 4, "megatron", 0),
    ("shard_append", 10, "bin-splits", 0),  # output.splits: domains under OUT/<split>/
    ("meta", 3, "bin-splits", 0),
    ("tokenize", 6, "bin-shuffled", 0),  # output.shuffle: killed while samples go to the buckets
    ("shard_append", 3, "bin-shuffled", 0),  # killed while the buckets go to the shards, in key order
    ("shard_close", 2, "parquet-shuffled", 0),
    ("tokenize", 7, "bin-spill", 0),  # the dedup seen-set spilled to files, rebuilt from the log on resume
    ("checkpoint", 5, "bin-near", 0),  # fuzzy_dedup's band keys logged, spilled, and rebuilt on resume
    ("rejects", 9, "bin-near", 0),
]
# The storage of each case: the output and preprocessing settings over CONFIG's.
STORAGES = {"bin": {}, "h5": {"output": {"storage_format": "h5"}}, "megatron": {"output": {"storage_format": "megatron"}},
            "bin-bfd": {"preprocessing": {"packing": "bfd"}},
            "parquet-bfd": {"output": {"storage_format": "parquet"}, "preprocessing": {"packing": "bfd"}},
            "parquet-wrapped": {"output": {"storage_format": "parquet"}, "preprocessing": {"packing": "wrapped"}},
            "bin-splits": {"output": {"splits": {"train": 0.7, "validation": 0.3}, "split_seed": 3}},
            "bin-shuffled": {"output": {"shuffle": True, "shuffle_seed": 9}},
            "bin-spill": {"preprocessing": {"dedup_memory_mb": 0.0003}},
            "bin-near": {"preprocessing": {"dedup_memory_mb": 0.002, "fuzzy_dedup": {"threshold": 0.6, "ngram": 3}}},
            "parquet-shuffled": {"output": {"storage_format": "parquet", "shuffle": True, "splits": {"a": 0.5, "b": 0.5}},
                                 "preprocessing": {"packing": "bfd"}}}


def _corpus(path: Path) -> Path:
    rows = []
    for i in range(400):
        words = " ".join(f"w{(i * 7 + k) % 97}" for k in range(5 + i % 40))
        rows.append({"source": ["news", "code", "chat"][i % 3],
                     "messages": [{"role": "user", "content": f"question {i % 350}: {words}"},
                                  {"role": "assistant", "content": f"answer {i % 350}: {words} {words}"}]})
    lines = [json.dumps(r) for r in rows]
    for k in range(0, 400, 37):  # bad rows among them, for the rejects file
        lines.insert(k, '{"messages": "not a list", "source": "news"}' if k % 2 else "{broken json")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _tree(root: Path) -> dict[str, bytes]:
    # How the engine was chosen is worded from the rows sampled, which a resumed run may not see again.
    return output_tree(root, "tokenizer.engine_choice")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("reference")
    data = _corpus(root / "chat.jsonl")
    trees = {}
    for storage, over in STORAGES.items():
        config = root / f"{storage}.json"
        # The storage variants test the writer's paths, not the tokenizer's: HF tokenizers spares each killed
        # process the fast engine's build (the "bin" cases keep the engine the default config picks).
        engine = {} if storage == "bin" else {"tokenizer": {"engine": "hf"}}
        settings = {**CONFIG, **{k: {**CONFIG.get(k, {}), **v} for k, v in {**over, **engine}.items()}}
        config.write_text(json.dumps(settings))
        out, rejects = root / storage, root / f"{storage}.rejects.jsonl"
        # Written in this process (the session's tokenizer): the killed runs are the CLI's.
        run(parse_config(settings), [str(data)], out, Options(chunk_rows=CHUNK_ROWS, rejects=rejects))
        trees[storage] = (config, _tree(out), rejects.read_bytes())
    return {"data": data, **trees}


@pytest.mark.parametrize(("point", "nth", "storage", "every"), CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_killed_anywhere_then_resumed_is_byte_identical(reference: dict[str, Any], tmp_path: Path, point: str,
                                                        nth: int, storage: str, every: int) -> None:
    config, want, want_rejects = reference[storage]
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    args = ["run", reference["data"], "-c", config, "-o", out, "-q", "--chunk-rows", CHUNK_ROWS,
            "--rejects", rejects, "--checkpoint-every", every]
    killed = gpu_prep_cli(*args, env={"GPU_PREP_FAILPOINT": f"{point}:{nth}"})
    assert killed.returncode == -9, f"not killed at {point}:{nth}: {killed.stderr}"

    # No partial file looks complete: whatever carries a final name is the finished file, byte for byte.
    assert not (out / MANIFEST).exists()
    assert not rejects.exists() or rejects.read_bytes() == want_rejects
    assert (out / ".gpu-prep-run").exists()
    for name, data in _tree(out).items():
        assert data == want[name], f"{name} has its final name but is not the finished file"
    assert gpu_prep_cli("verify", out).returncode != 0

    # Without --resume or --overwrite the directory is refused.
    again = gpu_prep_cli(*args)
    assert again.returncode == 2 and "--resume" in again.stderr

    manifest = run(parse_config(json.loads(config.read_text())), [str(reference["data"])], out, Options(resume=True,
                   chunk_rows=CHUNK_ROWS, rejects=rejects))
    assert manifest["totals"]["rows_read"] == 411
    assert _tree(out) == want
    assert rejects.read_bytes() == want_rejects
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == [".gpu-prep-files", ".gpu-prep-run"]
    assert gpu_prep_cli("verify", out).returncode == 0


def test_resume_refuses_a_changed_config(reference: dict[str, Any], tmp_path: Path) -> None:
    config, _, _ = reference["bin"]
    out = tmp_path / "out"
    killed = gpu_prep_cli("run", reference["data"], "-c", config, "-o", out, "-q", "--chunk-rows", CHUNK_ROWS,
                  "--checkpoint-every", 0, env={"GPU_PREP_FAILPOINT": "tokenize:5"})
    assert killed.returncode == -9
    changed = tmp_path / "changed.json"
    changed.write_text(json.dumps({**CONFIG, "preprocessing": {"max_seq_len": 128}}))
    refused = gpu_prep_cli("run", reference["data"], "-c", changed, "-o", out, "-q", "--resume")
    assert refused.returncode == 2 and "the config changed" in refused.stderr
    # A smaller dedup memory budget (after running out of memory, say) changes no byte of the output: resumed.
    budget = tmp_path / "budget.json"
    budget.write_text(json.dumps({**CONFIG, "preprocessing": {**CONFIG.get("preprocessing", {}), "dedup_memory_mb": 1}}))
    resumed = gpu_prep_cli("run", reference["data"], "-c", budget, "-o", out, "-q", "--resume")
    assert resumed.returncode == 0, resumed.stderr
    shards = {name: data for name, data in _tree(out).items() if name != "manifest.json"}
    assert shards == {name: data for name, data in reference["bin"][1].items() if name != "manifest.json"}


def test_resume_refused_for_changed_inputs_names_them(tmp_path: Path) -> None:
    # "the inputs changed" said not which: a file added to a folder, one gone, or one rewritten.
    from gpu_prep.errors import ConfigError
    from gpu_prep.run.checkpoint import CHECKPOINT, load_for_resume

    before = {"format": 1, "config": "c", "tokenizer": "t",
              "inputs": [["data/a.jsonl", 10, 1], ["data/b.jsonl", 20, 2], ["data/gone.jsonl", 5, 3]]}
    (tmp_path / CHECKPOINT).write_text(json.dumps({"identity": before, "writer": []}))
    now = {**before, "inputs": [["data/a.jsonl", 10, 1], ["data/b.jsonl", 21, 4], ["data/new.jsonl", 1, 5]]}
    with pytest.raises(ConfigError) as refused:
        load_for_resume(tmp_path, now)
    assert ("the inputs changed since it was started ('data/new.jsonl' added, 'data/gone.jsonl' gone, 'data/b.jsonl' "
            "changed); run with --overwrite to start again") in str(refused.value)
    with pytest.raises(ConfigError, match=r"the inputs changed since it was started \(the same files in another order\)"):
        load_for_resume(tmp_path, {**before, "inputs": before["inputs"][::-1]})


def test_resume_of_a_finished_run_changes_nothing(reference: dict[str, Any], tmp_path: Path) -> None:
    config, want, _ = reference["bin"]
    out = tmp_path / "out"
    assert gpu_prep_cli("run", reference["data"], "-c", config, "-o", out, "-q", "--chunk-rows", CHUNK_ROWS).returncode == 0
    assert gpu_prep_cli("run", reference["data"], "-c", config, "-o", out, "-q", "--resume").returncode == 0
    assert _tree(out) == want


def test_resume_keeps_to_the_interrupted_runs_rejects_file(reference: dict[str, Any], tmp_path: Path) -> None:
    # Resumed without the --rejects the run began, or with one it never began, the rows dropped before the
    # interruption would be missing from the file: refused, saying what to give.
    config, _, _ = reference["bin"]
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    base = ["run", reference["data"], "-c", config, "-o", out, "-q", "--chunk-rows", CHUNK_ROWS, "--checkpoint-every", 0]
    killed = gpu_prep_cli(*base, "--rejects", rejects, env={"GPU_PREP_FAILPOINT": "tokenize:5"})
    assert killed.returncode == -9
    refused = gpu_prep_cli(*base, "--resume")
    assert refused.returncode == 2 and "resume it with the same --rejects" in refused.stderr, refused.stderr
    mine = tmp_path / "mine.jsonl"  # another file given by mistake would be cut to the begun file's length
    mine.write_text("my own lines\n" * 1000)
    refused = gpu_prep_cli(*base, "--resume", "--rejects", mine)
    assert refused.returncode == 2 and f"writing its rejects file at {rejects}" in refused.stderr, refused.stderr
    assert mine.read_text() == "my own lines\n" * 1000
    assert gpu_prep_cli(*base, "--resume", "--rejects", rejects).returncode == 0
    other = tmp_path / "other"
    killed = gpu_prep_cli(*[other if a == out else a for a in base], env={"GPU_PREP_FAILPOINT": "tokenize:5"})
    assert killed.returncode == -9
    refused = gpu_prep_cli(*[other if a == out else a for a in base], "--resume", "--rejects", tmp_path / "late.jsonl")
    assert refused.returncode == 2 and "the interrupted run wrote no rejects file" in refused.stderr, refused.stderr


def test_a_resumed_runs_progress_counts_on_from_the_rows_done(reference: dict[str, Any], tmp_path: Path) -> None:
    # The rows a resumed run reads past are counted, as rows and bytes: it went on from 0 rows and 0% and
    # never reached 100%.
    config, _, _ = reference["bin"]
    out = tmp_path / "out"
    killed = gpu_prep_cli("run", reference["data"], "-c", config, "-o", out, "-q", "--chunk-rows", CHUNK_ROWS,
                          "--checkpoint-every", 0, env={"GPU_PREP_FAILPOINT": "shard_append:6"})
    assert killed.returncode == -9, killed.stderr
    seen: list[tuple[int, float]] = []
    options = Options(resume=True, chunk_rows=CHUNK_ROWS,
                      progress=lambda rows, tokens, read, total: seen.append((rows, read / total)))
    run(parse_config(json.loads(config.read_text())), [str(reference["data"])], out, options)
    assert seen[-1] == (411, 1.0), seen[-3:]
    first_rows, first_share = seen[0]
    assert first_rows > CHUNK_ROWS and first_share > first_rows / 411 / 2, seen[:3]


def test_resume_without_a_checkpoint_does_not_replace_a_rejects_file_it_did_not_begin(tmp_path: Path) -> None:
    # --resume with nothing to resume starts afresh: a file of the user's at the rejects path is not its own,
    # as it is not a fresh run's without --overwrite.
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    result = gpu_prep_cli("run", "-c", REPO / "configs/sft.json", REPO / "examples/chat.jsonl", "-o", tmp_path / "out",
                          "--rejects", notes, "-q", "--resume")
    assert result.returncode == 2 and "exists" in result.stderr, result.stderr
    assert notes.read_text() == "my notes\n"
