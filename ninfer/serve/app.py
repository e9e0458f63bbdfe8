"""The FastAPI application: OpenAI-compatible routes, health, metrics and the tokenizer endpoints.

The app only reads the ServerState; it never reaches a Program (the Runtime holds the Engine facade or the
CausalScoring core, and the Frontend). `create_app` takes a state whose runtime may still be None: the server
answers health checks while the model loads.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from ninfer.contracts import RequestRejected
from ninfer.frontend import ChatRequest

from . import errors
from .chat import chat_completions
from .completions import completions
from .errors import APIError
from .guard import Guard
from .json_body import OffLoopRoute, checked_body
from .media import MediaPolicy, acquire_messages
from .schemas import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .state import ServerState

# OpenAPI links: what one response feeds into the next request (clients and stateful fuzzers follow them).
MODEL_LINKS = {"ChatWithTheModel": {"operationId": "create_chat_completion", "requestBody": {
    "model": "$response.body#/data/0/id", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}}}
TOKENIZE_LINKS = {"DetokenizeTheTokens": {"operationId": "detokenize",
                                          "requestBody": {"tokens": "$response.body#/tokens"}}}


def _links(links: dict) -> dict:
    return {"responses": {"200": {"description": "Successful Response", "links": links}}}


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="ninfer", description="OpenAI-compatible API of the ninfer engine", version="1",
                  dependencies=[Depends(checked_body)])
    app.router.route_class = OffLoopRoute  # before any route: bodies parse on a thread (json_body.py)
    app.state.ninfer = state
    errors.install(app)
    app.add_middleware(Guard, state=state)
    _routes(app, state)
    return app


def _routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/chat/completions", operation_id="create_chat_completion")
    async def _chat(body: ChatCompletionRequest, request: Request) -> Any:
        return await chat_completions(body, request, state)

    @app.post("/v1/completions", operation_id="create_completion")
    async def _completions(body: CompletionRequest, request: Request) -> Any:
        return await completions(body, request, state)

    @app.get("/v1/models", operation_id="list_models", openapi_extra=_links(MODEL_LINKS))
    async def _models() -> dict:
        rt = state.runtime
        card = {"id": state.model_name, "object": "model", "created": int(time.time()), "owned_by": "ninfer",
                "root": str(rt.model_path), "max_model_len": rt.max_context, "random_weights": rt.random_weights,
                "speculative": rt.speculative}
        return {"object": "list", "data": [card]}

    @app.get("/health", operation_id="health")
    async def _health() -> Any:
        """Liveness: 200 while loading, serving or draining; 503 once the Engine failed (restart the process)."""
        rt = state.runtime
        if rt is not None and rt.failure is not None:
            return JSONResponse({"status": "engine_failed", "ready": False}, status_code=503)
        return {"status": "draining" if state.draining else "ok", "ready": _is_ready(state)}

    @app.get("/health/ready", operation_id="ready")
    async def _ready() -> Any:
        state.ready()
        rt = state.runtime
        return {"status": "ready", "purpose": rt.purpose, "model": state.model_name}

    @app.get("/metrics", operation_id="metrics", response_class=PlainTextResponse)
    async def _metrics() -> str:
        rt = state.runtime
        core = rt.engine or rt.scorer
        cache = rt.engine.cache_report() if rt.engine is not None else None
        return state.metrics.render(core.outstanding if core else 0, rt.available, cache)

    _tokenizer_routes(app, state)


def _tokenizer_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/tokenize", operation_id="tokenize", openapi_extra=_links(TOKENIZE_LINKS))
    async def _tokenize(body: TokenizeRequest, request: Request) -> dict:
        state.check_model(body.model)
        state.check_schema(body.response_format, body.tools)
        tokens = await state.preparer.run(lambda: _tokens_of(state, body), disconnected=request.is_disconnected)
        out: dict[str, Any] = {"count": len(tokens), "max_model_len": state.runtime.max_context, "tokens": tokens}
        if body.return_token_strs:
            out["token_strs"] = [state.runtime.frontend.tokenizer.id_to_token(t) for t in tokens]
        return out

    @app.post("/detokenize", operation_id="detokenize")
    async def _detokenize(body: DetokenizeRequest, request: Request) -> dict:
        state.check_model(body.model)
        tokenizer = state.runtime.frontend.tokenizer
        vocab = tokenizer.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"token id {bad} is outside the vocabulary (0..{vocab - 1})", param="tokens")
        text = await state.preparer.run(lambda: tokenizer.decode_batch([body.tokens])[0],
                                        disconnected=request.is_disconnected)
        return {"prompt": text}

    @app.get("/tokenizer_info", operation_id="tokenizer_info")
    async def _tokenizer_info() -> dict:
        rt = state.ready()
        tok = rt.frontend.tokenizer
        return {"tokenizer_class": "Qwen2TokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                "bos_token": None, "vocab_size": tok.vocab_size, "model_max_length": rt.max_context,
                "chat_template": rt.frontend.template.source if rt.frontend.template is not None else None}


def _is_ready(state: ServerState) -> bool:
    try:
        state.ready()
    except APIError:
        return False
    return True


def _tokens_of(state: ServerState, body: TokenizeRequest) -> list[int]:
    """A prompt's ids, or messages rendered exactly as a chat request with the same fields would be."""
    fe = state.runtime.frontend
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt")
    if body.prompt is not None:
        try:
            fe.check_text_fits(body.prompt, 0)
        except RequestRejected as e:
            raise APIError.from_rejection(e) from None
        return fe.tokenizer.encode(body.prompt)
    kwargs = {**state.runtime.options.default_chat_template_kwargs, **(body.chat_template_kwargs or {})}
    try:
        messages = acquire_messages(body.messages, MediaPolicy.of_runtime(state.runtime))
        chat = fe.prepare_chat(ChatRequest(messages, tools=body.tools, tool_choice=body.tool_choice,
                                           response_format=body.response_format, chat_template_kwargs=kwargs,
                                           add_generation_prompt=body.add_generation_prompt))
    except RequestRejected as e:
        raise APIError.from_rejection(e) from None
    media = chat.prompt.media  # an image's pads are counted and shown as the pad id, not its placeholder ids
    return list(chat.prompt.token_ids) if media is None else media.model_ids(chat.prompt.token_ids)
