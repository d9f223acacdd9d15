"""render: a row's canonical shape -> the text the model sees + the byte spans that are trained.

spans.py      the render stage: RenderContext, render_row, conversation spans, {% generation %} spans,
              reasoning, structured truncation, preference prompts and completions
templates.py  which chat template a run uses (the tokenizer's, a bundled name, a file)
sandbox.py    chat templates rendered in Jinja's sandbox, as transformers renders them, within time and size limits
affix.py      templates that are plain concatenation, learnt once and rendered without Jinja
locate.py     where each message's content lies in a rendering (sentinels), tool-call turns and empty contents
"""

__all__ = ["affix", "locate", "sandbox", "spans", "templates"]
