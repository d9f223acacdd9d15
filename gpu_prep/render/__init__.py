"""render: a row's canonical shape -> the text the model sees + the byte spans that are trained.

row.py         the render stage: render_row (and the affix check, row limits, reasoning cut)
context.py     RenderContext (built once a run), RenderedRow, spans in bytes after normalization
policy.py      MaskPolicy: the config's mask rules, read once, and messages' labels; whether {% generation %} markers rule
spans.py       a conversation's spans: role spans, {% generation %} spans, turn ends, tool-call turns
ranges.py      Region (a message's content in a rendering) and Span (a labelled range), as modules pass them
reasoning.py   whether a rendering shows reasoning, and think-block notes
pairs.py       preference pairs and KTO rows: prompt and completions
truncation.py  structured truncation: turns, then reasonings, then the prompt
tool_calls.py  tool-call arguments given as JSON strings made objects where the template wants them
templates.py   which chat template a run uses (the tokenizer's, a bundled name, a file)
sandbox.py     ChatTemplate: chat templates rendered in Jinja's sandbox, as transformers renders them
environment.py the sandboxed environment they compile in (transformers' globals and filters), guarded
limits.py      the time and size limits every render is held to (row_limits), checked before values are built
generation.py  the {% generation %} tag, and which message each generation block belongs to
affix.py       templates that are plain concatenation, learnt once and rendered without Jinja
locate.py      where each message's content lies in a rendering (sentinels)
"""

__all__ = ["affix", "context", "environment", "generation", "limits", "locate", "pairs", "policy", "ranges",
           "reasoning", "row", "sandbox", "spans", "templates", "tool_calls", "truncation"]
