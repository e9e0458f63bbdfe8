"""The prefix-execution boundary: an output gets one exactly when the next turn's rendering reproduces its tokens,
and the turn boundaries a chat prompt carries (message ends, the point before an opened <think>) are prefixes of
the next turn's prompt. Real vocabulary and template."""

from __future__ import annotations

from corpus import TOOLS, call
from helpers import generated_text
from ninfer.contracts import FinishReason
from ninfer.frontend import ChatRequest, OutputOptions

QUERY = [{"role": "user", "content": "Weather in Paris?"}]


def prepare(fe, messages, thinking=True):
    kwargs = None if thinking else {"enable_thinking": False}
    return fe.prepare_chat(ChatRequest(messages, TOOLS, chat_template_kwargs=kwargs))


def run_output(fe, messages, text, thinking=True):
    """The session's last preview boundary and result after the model 'generates' `text`."""
    prepared = prepare(fe, messages, thinking)
    session = fe.open_session(prepared.prompt, OutputOptions(max_tokens=400), prepared.structured)
    ids = fe.tokenizer.encode(text)
    preview = session.preview(ids)  # the whole output as one row, as a speculative round may deliver it
    assert preview.accepted == len(ids)
    session.commit(preview)
    return prepared.prompt, ids, preview.boundary, session.result()


def test_a_tool_call_turn_is_reproduced_by_the_next_request(fe):
    message = {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
               "tool_calls": [call("get_weather", city="Paris")]}
    for thinking in (True, False):
        if not thinking:
            message = {**message, "reasoning_content": ""}
        prompt, ids, boundary, result = run_output(fe, QUERY, generated_text(message, thinking), thinking)
        assert result.finish_reason is FinishReason.TOOL_CALLS and boundary == len(ids)
        nxt = prepare(fe, QUERY + [result.as_openai_message(), {"role": "tool", "content": "18 C"}], thinking)
        assert nxt.prompt.token_ids[:len(prompt) + len(ids)] == prompt.token_ids + tuple(ids)


def test_an_output_the_renderer_changes_has_no_boundary(fe):
    """Reasoning with surrounding blanks is stripped by the renderer: not reproduced, so no boundary."""
    text = "  Look it up.  \n</think>\n\nIt is sunny.<|im_end|>"
    prompt, ids, boundary, result = run_output(fe, QUERY, text)
    assert result.finish_reason is FinishReason.STOP and boundary is None
    nxt = prepare(fe, QUERY + [result.as_openai_message(), {"role": "tool", "content": "x"}])
    assert nxt.prompt.token_ids[:len(prompt) + len(ids)] != prompt.token_ids + tuple(ids)


def test_turn_boundaries_are_prefixes_of_the_next_turn(fe):
    """The next user turn drops this turn's reasoning: the prompt's boundary just after `<|im_start|>assistant\\n`
    is the deepest prefix they share."""
    prompt = prepare(fe, QUERY).prompt
    reply = {"role": "assistant", "content": "Sunny.", "reasoning_content": "Easy."}
    nxt = prepare(fe, QUERY + [reply, {"role": "user", "content": "And Rome?"}]).prompt
    shared = next(i for i, (a, b) in enumerate(zip(prompt.token_ids, nxt.token_ids)) if a != b)
    lengths = [b.length for b in prompt.boundaries]
    assert lengths[-1] == shared == len(prompt) - 2  # before "<think>" "\n"
    assert all(nxt.token_ids[:n] == prompt.token_ids[:n] for n in lengths)
