"""lm-eval's `local-completions` runs a tiny local multiple-choice task against `ninfer serve --purpose scoring`;
every loglikelihood it reports equals the reference model's CausalScoring of the same tokens."""

from __future__ import annotations

import json

import pytest

DOCS = [
    {"question": "The sky is", "choices": [" blue", " green", " loud"], "answer": 0},
    {"question": "Two plus two is", "choices": [" four", " five"], "answer": 0},
    {"question": "Water is", "choices": [" wet and cold today", " dry"], "answer": 0},
]

TASK = """task: ninfer_tiny
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: answer
metric_list:
  - metric: acc
"""


def encode_pair(tok, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's TemplateLM._encode_pair: trailing context spaces move to the continuation, and the continuation's
    tokens are those of the whole text past the context's."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole, ctx = tok.encode(context + continuation), tok.encode(context)
    return ctx, whole[len(ctx):]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_task")
    data = d / "data.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (d / "ninfer_tiny.yaml").write_text(TASK.format(data=data))
    return d


def test_local_completions_loglikelihood_equals_reference(scoring_server, task_dir, _default_model_built,
                                                          monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import lm_eval
    from lm_eval.tasks import TaskManager

    from ninfer.artifact import open_artifact
    from ninfer.frontend.tokenizer import Qwen35Tokenizer
    from ninfer.models.qwen3_5.params import TEXT
    from ninfer.reference.program import CausalScoring
    from ninfer.reference.weights import load_model

    args = (f"base_url={scoring_server.url}/v1/completions,model=ninfer-default-random,tokenizer_backend=remote,"
            "tokenized_requests=True,num_concurrent=1,max_retries=1,max_length=512")
    out = lm_eval.simple_evaluate(model="local-completions", model_args=args, tasks=["ninfer_tiny"],
                                  task_manager=TaskManager(include_path=str(task_dir)), log_samples=True,
                                  num_fewshot=0, random_seed=0, bootstrap_iters=0)
    samples = out["samples"]["ninfer_tiny"]
    assert len(samples) == len(DOCS)
    with open_artifact(_default_model_built) as art:
        tok = Qwen35Tokenizer.load(art.resource("tokenizer.json").decode())
    scoring = CausalScoring(load_model(_default_model_built, features=(TEXT,)))
    checked = 0
    for sample in samples:
        for (context, continuation), resp in zip(sample["arguments"], sample["resps"]):
            ctx, cont = encode_pair(tok, context, continuation)
            ref = scoring.score(ctx + cont, window=128, stride=64)
            expected = sum(ref.logprobs[len(ctx) - 1:])
            got, greedy = resp[0]
            assert float(got) == pytest.approx(expected, abs=1e-4), (context, continuation)
            assert greedy == all(ref.greedy[len(ctx) - 1:])
            checked += 1
    assert checked == sum(len(d["choices"]) for d in DOCS)
    acc = out["results"]["ninfer_tiny"]["acc,none"]
    assert 0.0 <= acc <= 1.0
