"""Load a Qwen3.5 ``tokenizer.json`` and give it a small typed face with the control-token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer

from ninfer.errors import ExitCode, NinferError


class TokenizerLoadError(NinferError, ValueError):
    """A tokenizer source that cannot be read, or is not a Qwen3.5 tokenizer."""

    exit_code = ExitCode.BAD_MODEL
    hint = "ninfer runs the Qwen3.5 vocabulary only; remove the checkpoint's tokenizer.json to use the built-in one"


def load_tokenizer(source: str | Path) -> Tokenizer:
    """A ``tokenizers.Tokenizer`` from ``tokenizer.json`` text or from a path to such a file.

    A ``str`` whose first non-blank character is ``{`` is taken as JSON text; anything else is a path.
    """
    if isinstance(source, str) and source.lstrip().startswith("{"):
        try:
            return Tokenizer.from_str(source)
        except Exception as e:
            raise TokenizerLoadError(f"tokenizer JSON text does not parse: {e}") from e
    path = Path(source)
    if not path.is_file():
        raise TokenizerLoadError(f"tokenizer file {path} does not exist")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise TokenizerLoadError(f"tokenizer file {path} does not parse: {e}") from e


class Qwen35Tokenizer:
    """Encode and decode with the Qwen3.5 vocabulary; no BOS is ever added.

    The id constants are checked against the loaded vocabulary, so a tokenizer of another family is
    refused at load time instead of producing wrong control tokens later.
    """

    ENDOFTEXT = 248044
    IM_START = 248045
    IM_END = 248046
    VISION_START = 248053
    VISION_END = 248054
    IMAGE_PAD = 248056
    VIDEO_PAD = 248057
    TOOL_CALL = 248058
    TOOL_CALL_END = 248059
    TOOL_RESPONSE = 248066
    TOOL_RESPONSE_END = 248067
    THINK = 248068
    THINK_END = 248069

    CONTROL_TOKENS = {
        ENDOFTEXT: "<|endoftext|>",
        IM_START: "<|im_start|>",
        IM_END: "<|im_end|>",
        VISION_START: "<|vision_start|>",
        VISION_END: "<|vision_end|>",
        IMAGE_PAD: "<|image_pad|>",
        VIDEO_PAD: "<|video_pad|>",
        TOOL_CALL: "<tool_call>",
        TOOL_CALL_END: "</tool_call>",
        TOOL_RESPONSE: "<tool_response>",
        TOOL_RESPONSE_END: "</tool_response>",
        THINK: "<think>",
        THINK_END: "</think>",
    }

    def __init__(self, tokenizer: Tokenizer):
        for token_id, content in self.CONTROL_TOKENS.items():
            found = tokenizer.id_to_token(token_id)
            if found != content:
                raise TokenizerLoadError(
                    f"not a Qwen3.5 tokenizer: id {token_id} should be {content!r}, found {found!r}")
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, source: str | Path) -> "Qwen35Tokenizer":
        """From ``tokenizer.json`` text or a path to it (see :func:`load_tokenizer`)."""
        return cls(load_tokenizer(source))

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base BPE plus added tokens)."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; control-token text such as ``<|im_start|>`` maps to its single id."""
        return self.encoding(text).ids

    def encoding(self, text: str):
        """The ``tokenizers.Encoding`` of ``text`` (ids and character offsets). The batch call releases the GIL
        while it runs (``encode`` holds it): a long prompt tokenizing on a worker thread leaves the server's event
        loop and the Engine's worker running."""
        return self.tokenizer.encode_batch([text], add_special_tokens=False)[0]

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode_batch(self, batch: Iterable[Iterable[int]], skip_special_tokens: bool = False) -> list[str]:
        """`decode` of each id list, with the GIL released while it runs (for long lists on worker threads)."""
        return self.tokenizer.decode_batch([list(ids) for ids in batch], skip_special_tokens=skip_special_tokens)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``. With ``skip_special_tokens``, control tokens are dropped but reasoning and
        tool markers (``<think>``, ``<tool_call>``, ...) are kept: they are not special."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self.tokenizer.id_to_token(token_id)
