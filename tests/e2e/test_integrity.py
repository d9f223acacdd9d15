"""Nothing lost, ever: gpu-prep never destroys what it did not write, two runs never share an output, a
write error leaves a run --resume finishes byte for byte, inputs that change under a run fail it, and the
reader and verify accept only complete, unedited runs."""

from __future__ import annotations

import errno
import json
import os
import random
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import gpu_prep
from gpu_prep.config import parse_config
from gpu_prep.errors import InputError
from gpu_prep.pipeline import Options, run
from helpers import REPO, gpu_prep_cli, output_tree, write_jsonl

pytestmark = pytest.mark.usefixtures("fast_tokenizer")

CHATS = [{"messages": [{"role": "user", "content": f"Question {k}: " + "how far is it? " * (k % 13)},
                       {"role": "assistant", "content": f"Answer {k}: " + "quite far. " * (k % 17 + 1)}]}
         for k in range(600)]
CONFIG = {"input": {"type": "chat"}, "mask": {"assistant": "train"},
          "output": {"max_tokens_per_shard": 6000}}


@pytest.fixture
def job(tmp_path: Path) -> tuple[Path, Path]:
    (tmp_path / "in").mkdir()
    rows: list = list(CHATS)
    for k in range(0, len(rows), 97):  # bad rows all through, so the rejects file grows with the run
        rows.insert(k, "{broken")
    data = write_jsonl(tmp_path / "in" / "chat.jsonl", rows)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    return data, config


def _tree(root: Path) -> dict[str, bytes]:
    # How the engine was chosen is worded from the rows sampled, which a resumed run may not see again.
    return output_tree(root, "tokenizer.engine_choice")


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_no_output_path_is_or_holds_or_lies_inside_an_input(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, config = job
    before = _files(tmp_path / "in")
    folder = data.parent  # given as the input, a folder's files are all read
    cases = [(data, "-o", data, "is the input"), (data, "-o", folder, "holds the input"),
             (folder, "-o", folder / "out", "lies inside the input"), (data, "-o", tmp_path, "holds the input"),
             (data, "--rejects", data, "is the input"), (folder, "--rejects", folder / "rejects.jsonl", "lies inside"),
             (f"file://{folder}", "--rejects", folder / "rejects.jsonl", "lies inside")]  # file:// is a local path
    for source, option, path, relation in cases:
        args = ["run", "-c", config, source, "-q"]
        args += ["-o", tmp_path / "out", "--rejects", path] if option == "--rejects" else ["-o", path, "--overwrite"]
        refused = gpu_prep_cli(*args)
        assert refused.returncode == 2, (option, path, refused.stderr)
        assert relation in refused.stderr and "Traceback" not in refused.stderr
        assert _files(tmp_path / "in") == before  # the input untouched, nothing written beside it
    assert not (tmp_path / "out").exists()


def test_the_config_in_a_folder_given_as_input_is_refused_not_read_as_a_row(job: tuple[Path, Path],
                                                                          tmp_path: Path) -> None:
    # A config.json kept beside the data: the folder's JSON files are all read, and the config would be one
    # row dropped as missing_field among the data's. Refused before anything is written, naming it.
    data, config = job
    inside = data.parent / "config.json"
    inside.write_text(config.read_text())
    refused = gpu_prep_cli("run", "-c", inside, data.parent, "-o", tmp_path / "out", "-q")
    said = " ".join(refused.stderr.split())
    assert refused.returncode == 2 and f"input {str(inside)!r} is " in said and "not as data" in said, refused.stderr
    assert not (tmp_path / "out").exists()
    assert gpu_prep_cli("run", "-c", inside, data, "-o", tmp_path / "out", "-q").returncode == 0  # the data named


def test_a_rejects_path_that_would_replace_what_gpu_prep_did_not_write_is_refused(job: tuple[Path, Path],
                                                                                   tmp_path: Path) -> None:
    # The config the run reads, a file of the user's, and the output's own files (which would replace the
    # rejects, or be replaced by them) are refused before anything is written: exit 2, nothing changed.
    data, config = job
    out, notes = tmp_path / "out", tmp_path / "notes.txt"
    notes.write_text("my notes")
    cases = [(config, "which the run reads"), (notes, "exists; pass --overwrite"), (tmp_path, "holds the input"),
             (out / "manifest.json", "where gpu-prep writes its own files"),
             (out / ".gpu-prep-files", "where gpu-prep writes its own files"),
             (out / "tokenizer" / "tokenizer.json", "where gpu-prep writes its own files")]
    for path, why in cases:
        refused = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--rejects", path)
        assert refused.returncode == 2 and why in refused.stderr and "Traceback" not in refused.stderr, (path, refused)
    assert config.read_text() == json.dumps(CONFIG) and notes.read_text() == "my notes" and not out.exists()
    # --overwrite may replace an existing rejects file, but never the config.
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--rejects", notes, "--overwrite").returncode == 0
    assert json.loads(notes.read_text().splitlines()[0])["reason"] == "malformed_json"
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--rejects", config, "--overwrite").returncode == 2


def test_a_rejects_file_in_the_output_folder_is_kept_apart_from_the_runs_own_files(job: tuple[Path, Path],
                                                                                  tmp_path: Path) -> None:
    # Directly in -o under a name of the user's, the rejects file is the run's: verify checks it, --overwrite
    # and --resume carry it on, and a domain of the same name gets a folder of its own.
    data, config = job
    rows = [{**row, "source": "rejects.jsonl"} for row in CHATS[:50]] + ["{broken"]
    data = write_jsonl(data, rows)
    config.write_text(json.dumps({**CONFIG, "output": {"domain_key": "source"}}))
    out = tmp_path / "out"
    args = ["run", "-c", config, data, "-o", out, "-q", "--rejects", out / "rejects.jsonl"]
    assert gpu_prep_cli(*args).returncode == 0
    assert json.loads((out / "rejects.jsonl").read_text())["reason"] == "malformed_json"
    assert (out / "rejects.jsonl-2" / "meta.json").is_file()
    assert gpu_prep_cli("verify", out).returncode == 0
    assert gpu_prep_cli(*args, "--overwrite").returncode == 0 and gpu_prep_cli(*args, "--resume").returncode == 0
    assert gpu_prep_cli("verify", out).returncode == 0
    (out / "mine.txt").write_text("mine")
    refused = gpu_prep_cli(*args[:-1], out / "mine.txt", "--overwrite")
    assert refused.returncode == 2 and "gpu-prep did not write" in refused.stderr
    assert (out / "mine.txt").read_text() == "mine"


def test_a_folder_whose_file_list_was_written_over_is_refused_by_name(job: tuple[Path, Path], tmp_path: Path) -> None:
    # An older version let --rejects write over OUT/.gpu-prep-files; such a folder is refused with a sentence
    # (which files are gpu-prep's is lost), not a traceback.
    data, config = job
    out = tmp_path / "out"
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q").returncode == 0
    (out / ".gpu-prep-files").write_text('{"file": "chat.jsonl", "line": 1, "reason": "malformed_json"}\n')
    refused = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite")
    assert refused.returncode == 2 and "not the list of files gpu-prep wrote" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr


def test_overwrite_and_resume_remove_only_what_gpu_prep_wrote(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, config = job
    out = tmp_path / "out"
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q").returncode == 0
    want = _tree(out)
    mine = {"notes.md": b"my notes", "__default__/README": b"what these shards are", "extra/keep.bin": b"\x00\x01"}
    for name, content in mine.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(content)
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite").returncode == 0
    # Killed half way, then resumed: the resume clears what the killed run wrote after its checkpoint.
    killed = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite", "--chunk-rows", 50,
                          "--checkpoint-every", 0, env={"GPU_PREP_FAILPOINT": "tokenize:6"})
    assert killed.returncode == -9
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--resume", "--chunk-rows", 50).returncode == 0
    assert all((out / name).read_bytes() == content for name, content in mine.items())
    assert {k: v for k, v in _tree(out).items() if k not in mine} == want
    assert gpu_prep_cli("verify", out).returncode == 0  # files beside the run's are not its business


def test_nothing_is_written_or_removed_through_a_link_in_the_output(job: tuple[Path, Path], tmp_path: Path) -> None:
    """A domain folder, a control file or a new domain's folder made a link to elsewhere: --overwrite refuses
    the output (exit 2) naming the link, and what the link leads to is left as it was."""
    data, config = job
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q").returncode == 0
    (out / "__default__").rename(elsewhere)
    (out / "__default__").symlink_to(elsewhere, target_is_directory=True)
    theirs = _files(elsewhere)
    refused = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite")
    assert refused.returncode == 2 and f"{out / '__default__'} is a link" in refused.stderr, refused.stderr
    assert _files(elsewhere) == theirs
    (out / "__default__").unlink()
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite").returncode == 0

    target = tmp_path / "precious.txt"
    target.write_bytes(b"keep me")
    for control in (".gpu-prep-lock", ".gpu-prep-files", ".gpu-prep-run"):
        saved = (out / control).read_bytes() if (out / control).exists() else None
        (out / control).unlink(missing_ok=True)
        (out / control).symlink_to(target)
        refused = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--overwrite")
        assert refused.returncode == 2 and f"{out / control} is a link" in refused.stderr, (control, refused.stderr)
        assert target.read_bytes() == b"keep me"
        (out / control).unlink()
        if saved is not None:
            (out / control).write_bytes(saved)

    # A folder where a domain the journal does not know yet will be written: refused when the run gets there.
    domains = tmp_path / "domains.jsonl"
    write_jsonl(domains, [{**row, "source": "web"} for row in CHATS[:50]])
    (elsewhere / "web").mkdir()
    (out / "web").symlink_to(elsewhere / "web", target_is_directory=True)
    config.write_text(json.dumps({**CONFIG, "output": {**CONFIG["output"], "domain_key": "source"}}))
    refused = gpu_prep_cli("run", "-c", config, domains, "-o", out, "-q", "--overwrite")
    assert refused.returncode == 2 and f"{out / 'web'} is a link" in refused.stderr, refused.stderr
    assert not any((elsewhere / "web").iterdir())


def test_two_runs_started_together_never_share_an_output(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, config = job
    (tmp_path / "big").mkdir()
    big = write_jsonl(tmp_path / "big" / "chat.jsonl", CHATS * 6)
    config.write_text(json.dumps({**CONFIG, "preprocessing": {"deduplicate": False}}))
    out = tmp_path / "out"
    script = Path(sys.executable).parent / "gpu-prep"
    runs = [subprocess.Popen([str(script), "run", "-c", str(config), str(big), "-o", str(out), "-q", "--overwrite",
                              "--chunk-rows", "100"], stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in runs]
    codes = sorted(code for code, _ in results)
    loser = next(err for code, err in results if code != 0) if codes != [0, 0] else ""
    # Either one waited for nothing and was refused at once, or it came after the first had finished and
    # replaced its output whole; never two at once.
    assert codes == [0, 2] and "being written by another gpu-prep run (pid" in loser or codes == [0, 0], results
    assert gpu_prep_cli("verify", out).returncode == 0
    assert gpu_prep.open(out).manifest["totals"]["rows_read"] == 3600


def _limit_file_size(limit: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    return apply


def test_a_write_error_names_the_file_and_resume_finishes_the_run(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, config = job
    config.write_text(json.dumps({**CONFIG, "output": {}}))  # one shard: its sequence file is about 480 KB
    clean = tmp_path / "clean"
    args = ["-c", str(config), str(data), "-q", "--chunk-rows", "50", "--rejects"]
    assert gpu_prep_cli("run", *args, tmp_path / "clean.rejects", "-o", clean).returncode == 0
    out, rejects = tmp_path / "out", tmp_path / "out.rejects"
    script = Path(sys.executable).parent / "gpu-prep"
    # A file-size limit (ulimit -f) below the shards' size: writing one fails part way, after checkpoints.
    limited = subprocess.run([str(script), "run", *args, str(rejects), "-o", str(out), "--checkpoint-every", "0"],
                             capture_output=True, text=True, cwd=REPO, preexec_fn=_limit_file_size(200_000))
    assert limited.returncode == 1, limited.stderr
    message = limited.stderr
    assert "File too large" in message and str(out) in message and "Traceback" not in message
    assert "once the cause is fixed, --resume finishes the run" in message
    resumed = gpu_prep_cli("run", *args, rejects, "-o", out, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _tree(out) == _tree(clean)
    assert rejects.read_bytes() == (tmp_path / "clean.rejects").read_bytes()


def test_a_write_error_on_the_rejects_file_names_it(job: tuple[Path, Path], tmp_path: Path) -> None:
    # Rows dropped with 2 KB each: the rejects file passes a 150 KB file-size limit long before the shards do.
    # Closing it after the error fails again (what it still buffers cannot be written either); the message
    # must still be the first error's, naming the file.
    data, config = job
    data = write_jsonl(data, [row for row in CHATS[:200] for row in (row, "{broken " + "x" * 2000)])
    rejects = tmp_path / "out.rejects"
    script = Path(sys.executable).parent / "gpu-prep"
    limited = subprocess.run([str(script), "run", "-c", str(config), str(data), "-q", "-o", str(tmp_path / "out"),
                              "--rejects", str(rejects), "--set", "preprocessing.max_drop_share=0.9"],
                             capture_output=True, text=True, cwd=REPO, preexec_fn=_limit_file_size(150_000))
    assert limited.returncode == 1, limited.stderr
    assert f"{tmp_path / '.out.rejects.tmp'}: File too large" in limited.stderr, limited.stderr


@pytest.mark.parametrize(("point", "nth"), [("shard_append", 2), ("checkpoint", 3), ("shard_close", 2), ("meta", 1),
                                            ("rejects", 1), ("manifest", 1)])
def test_a_full_disk_anywhere_then_resume_is_byte_identical(job: tuple[Path, Path], tmp_path: Path, point: str,
                                                            nth: int) -> None:
    data, config = job
    args = ["-c", str(config), str(data), "-q", "--chunk-rows", "50"]
    assert gpu_prep_cli("run", *args, "-o", tmp_path / "clean", "--rejects", tmp_path / "clean.rejects").returncode == 0
    out, rejects = tmp_path / "out", tmp_path / "out.rejects"
    full = gpu_prep_cli("run", *args, "-o", out, "--rejects", rejects, "--checkpoint-every", 0,
                        env={"GPU_PREP_FAILPOINT": f"{point}:{nth}", "GPU_PREP_FAILPOINT_SIGNAL": "ENOSPC"})
    # One sentence naming the file the disk filled on, and what --resume does.
    assert full.returncode == 1 and re.match(rf"error: {tmp_path}/\S+: No space left on device; the run stopped, ",
                                             full.stderr) and "--resume" in full.stderr, full.stderr
    assert "Traceback" not in full.stderr
    assert gpu_prep_cli("run", *args, "-o", out, "--rejects", rejects, "--resume").returncode == 0
    assert _tree(out) == _tree(tmp_path / "clean")
    assert rejects.read_bytes() == (tmp_path / "clean.rejects").read_bytes()


def test_a_full_disk_that_also_fails_closing_the_logs_is_told_as_the_first_error(
        job: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a full disk the manifest's write fails, and so does the dedup log's last flush as the run closes it:
    the error told is the first one, naming the file, with what --resume does (not a bare errno line)."""
    from gpu_prep import failpoint
    from gpu_prep.errors import WriteError
    from gpu_prep.run import checkpoint

    class FullAtClose:
        def __init__(self, handle: Any) -> None:
            self.handle = handle

        def __getattr__(self, name: str) -> Any:
            return getattr(self.handle, name)

        def close(self) -> None:
            self.handle.close()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a buffered flush reports it: no file

    log = checkpoint._log
    monkeypatch.setattr(checkpoint, "_log", lambda path, length: FullAtClose(log(path, length)))
    monkeypatch.setitem(failpoint._ARMED, "manifest", 1)
    monkeypatch.setenv("GPU_PREP_FAILPOINT_SIGNAL", "ENOSPC")
    data, _ = job
    out = tmp_path / "out"
    with pytest.raises(WriteError, match=rf"^{out / 'manifest.json'}: No space left on device; the run stopped, "
                                         r".*--resume finishes the run"):
        run(parse_config(CONFIG), [str(data)], out, Options(chunk_rows=50, checkpoint_seconds=0))


def test_an_input_that_changes_while_read_fails_the_run(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, _ = job
    original = data.read_bytes()

    def truncate_once(rows: int, tokens: int, done: int | None, total: int) -> None:
        if data.stat().st_size == len(original):
            with open(data, "r+b") as handle:
                handle.truncate(len(original) // 3)

    with pytest.raises(InputError, match=rf"{data}: changed since the run started \({len(original):,} bytes then, "
                                         rf"{len(original) // 3:,} now"):
        run(parse_config(CONFIG), [str(data)], tmp_path / "out", Options(chunk_rows=50, progress=truncate_once))
    assert not (tmp_path / "out" / "manifest.json").exists()
    data.write_bytes(original)  # unchanged, the same run passes, and its checksum is of the bytes read
    manifest = run(parse_config(CONFIG), [str(data)], tmp_path / "again", Options(chunk_rows=50))
    import hashlib

    assert manifest["inputs"][0]["sha256"] == hashlib.sha256(original).hexdigest()


@pytest.mark.parametrize("change", ["cut", "append"])
def test_an_input_changed_before_its_first_read_fails_the_run(job: tuple[Path, Path], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """The identity the run took when it found the input (before loading the tokenizer, which takes seconds) is
    the one every read is held to: a file cut or appended to in between is not read as the data."""
    data, _ = job
    original = data.read_bytes()
    load = gpu_prep.pipeline.load_tokenizer

    def change_then_load(*args: object, **kwargs: object) -> object:
        with open(data, "r+b") as handle:
            if change == "cut":
                handle.truncate(1000)
            else:
                handle.seek(0, 2)
                handle.write(b'{"messages": [{"role": "user", "content": "late"}]}\n' * 5)
        return load(*args, **kwargs)

    monkeypatch.setattr(gpu_prep.pipeline, "load_tokenizer", change_then_load)
    now = 1000 if change == "cut" else len(data.read_bytes()) + 5 * 52
    with pytest.raises(InputError, match=rf"{data}: changed since the run started \({len(original):,} bytes then, "
                                         rf"{now:,} now"):
        run(parse_config(CONFIG), [str(data)], tmp_path / "out", Options(chunk_rows=50))
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_reader_and_verify_accept_only_complete_unedited_runs(job: tuple[Path, Path], tmp_path: Path) -> None:
    data, config = job
    out = tmp_path / "out"
    killed = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--chunk-rows", 50, "--checkpoint-every", 0,
                          env={"GPU_PREP_FAILPOINT": "tokenize:4"})
    assert killed.returncode == -9
    with pytest.raises(FileNotFoundError, match="manifest.json: missing.*not a finished run.*--resume"):
        gpu_prep.open(out)
    assert gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", "--resume", "--chunk-rows", 50).returncode == 0
    assert len(gpu_prep.open(out)["__default__"]) == 600

    manifest_path = out / "manifest.json"
    pristine = manifest_path.read_text()
    for edit in (lambda m: m["totals"].update(rows_written=m["totals"]["rows_written"] + 1),
                 lambda m: m["config"]["preprocessing"].update(max_seq_len=1),
                 lambda m: m["files"].pop(next(iter(m["files"])))):
        manifest = json.loads(pristine)
        edit(manifest)
        manifest_path.write_text(json.dumps(manifest))
        with pytest.raises(ValueError, match="manifest.json: edited after the run"):
            gpu_prep.open(out)
        result = gpu_prep_cli("verify", out)
        assert result.returncode == 1 and "edited after the run" in result.stdout + result.stderr
    manifest_path.write_text(pristine)

    shard = out / "__default__" / "sequence.bin"  # the first shard, holding sample 0
    saved = shard.read_bytes()
    shard.write_bytes(b"")  # a zero-byte shard
    with pytest.raises(ValueError, match=rf"{shard}.*0 tokens"):
        gpu_prep.open(out)["__default__"][0]
    result = gpu_prep_cli("verify", out)
    assert result.returncode == 1 and f"{shard}: 0 bytes" in result.stdout + result.stderr
    shard.write_bytes(saved)
    config_file = out / "tokenizer" / "tokenizer_config.json"  # the eos token swapped, the size kept
    saved = config_file.read_bytes()
    config_file.write_bytes(saved.replace(b'"eos_token": "<|im_end|>"', b'"eos_token": "<|im_sep|>"', 1))
    assert config_file.read_bytes() != saved and len(config_file.read_bytes()) == len(saved)
    result = gpu_prep_cli("verify", out)
    assert result.returncode == 1 and f"{config_file}: does not match its recorded sha256" in result.stderr
    config_file.write_bytes(saved)
    assert gpu_prep_cli("verify", out).returncode == 0
    (out / "__default__" / "meta.json").rename(tmp_path / "meta.json")  # a domain without its meta.json
    with pytest.raises(FileNotFoundError, match=r"__default__/meta.json: missing"):
        gpu_prep.open(out)
    assert gpu_prep_cli("verify", out).returncode == 1


FAILPOINTS = ["read", "tokenize", "shard_append", "shard_close", "rejects", "checkpoint", "checkpoint_written",
              "meta", "manifest"]


def test_a_random_stop_at_a_random_point_then_resume_gives_the_clean_bytes(job: tuple[Path, Path], tmp_path: Path) -> None:
    """A property over seeded random draws: kill (SIGKILL or Ctrl-C) or fail a write at a random pass of a
    random point, with random chunking and checkpointing; --resume always gives the uninterrupted run's bytes."""
    data, config = job
    clean, clean_rejects = tmp_path / "clean", tmp_path / "clean.rejects"
    assert gpu_prep_cli("run", "-c", config, data, "-o", clean, "-q", "--rejects", clean_rejects).returncode == 0
    want = _tree(clean)
    seed = int(os.environ.get("GPU_PREP_TEST_SEED", time.time_ns() % 10_000))
    draw = random.Random(seed)
    for case in range(4):
        point, nth, how = draw.choice(FAILPOINTS), draw.randint(1, 8), draw.choice(["KILL", "INT", "ENOSPC"])
        chunk_rows, every = draw.choice([30, 70, 200]), draw.choice([0, 0, 3600])
        out, rejects = tmp_path / f"out{case}", tmp_path / f"out{case}.rejects"
        args = ["run", "-c", config, data, "-o", out, "-q", "--rejects", rejects, "--chunk-rows", chunk_rows]
        stopped = gpu_prep_cli(*args, "--checkpoint-every", every,
                               env={"GPU_PREP_FAILPOINT": f"{point}:{nth}", "GPU_PREP_FAILPOINT_SIGNAL": how})
        where = f"seed {seed} (GPU_PREP_TEST_SEED), case {case}: {point}:{nth} {how}, chunks {chunk_rows}, every {every}"
        assert "Traceback" not in stopped.stderr, where
        resumed = gpu_prep_cli(*args, "--resume")
        assert resumed.returncode == 0, f"{where}: {resumed.stderr}"
        assert _tree(out) == want, where
        assert rejects.read_bytes() == clean_rejects.read_bytes(), where


@pytest.mark.parametrize("point", ["meta", "manifest"])
def test_a_run_killed_while_it_finishes_resumes_with_the_rejects_file_it_began(job: tuple[Path, Path], tmp_path: Path,
                                                                            point: str) -> None:
    """Killed after its rejects file took its name but before the manifest, and before any timed checkpoint:
    --resume goes on with that file (it is the run's own) and gives the uninterrupted run's bytes."""
    data, config = job
    clean, clean_rejects = tmp_path / "clean", tmp_path / "clean.rejects"
    assert gpu_prep_cli("run", "-c", config, data, "-o", clean, "-q", "--rejects", clean_rejects).returncode == 0
    out, rejects = tmp_path / "out", tmp_path / "out.rejects"
    args = ["run", "-c", config, data, "-o", out, "-q", "--rejects", rejects, "--checkpoint-every", 3600]
    stopped = gpu_prep_cli(*args, env={"GPU_PREP_FAILPOINT": f"{point}:1", "GPU_PREP_FAILPOINT_SIGNAL": "KILL"})
    assert stopped.returncode != 0 and rejects.exists() and not (out / "manifest.json").exists()
    resumed = gpu_prep_cli(*args, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert _tree(out) == _tree(clean)
    assert rejects.read_bytes() == clean_rejects.read_bytes()
