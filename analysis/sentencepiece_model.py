"""A SentencePiece model (the serialized ModelProto that mpiformer keeps in
shards, checkpoints and tokenizer.model) read without the sentencepiece
package, and written as a Hugging Face fast-tokenizer description
(tokenizer.json, for the `tokenizers` library that transformers'
AutoTokenizer runs on) that encodes and decodes as SentencePiece does.

read_model(bytes) -> SentencePieceModel: the pieces (text, score, type),
the trainer and normalizer settings that change encoding or decoding.
convertible(model) -> why not (a list, empty when it converts).
tokenizer_json(model, bos_id) -> the tokenizer.json document (a dict).

How SentencePiece (0.1.97, the library mpiformer links) encodes a line,
and the tokenizers pieces that do the same:
  1. the precompiled character map (nmt_nfkc by default): Precompiled;
  2. remove_extra_whitespaces: no leading or trailing space, runs of
     spaces as one: two Replace normalizers on U+0020 alone, which is the
     only space SentencePiece collapses (the map has already turned tabs
     and the other spaces into it);
  3. add_dummy_prefix: U+2581 before the text; then every space becomes
     U+2581 (escape_whitespaces);
  4. the model: Unigram (Viterbi over the pieces' scores; characters no
     piece covers are <unk>, a run of them one <unk>) or BPE (merges in
     the order of the merged piece's score);
  5. user-defined symbols ([MASK], [SEP]) are always one piece wherever
     they stand. In a Unigram model they stay in the vocabulary with the
     score SentencePiece gives them in its lattice, so the lattice picks
     them as SentencePiece's does and the dummy prefix before a line that
     starts with one is kept. A BPE model cannot hold them, so they are
     added tokens matched in the normalized text; the dummy prefix is then
     added unless the line is nothing but one of them (BPE alone encodes
     such a line without its leading U+2581 piece).
Decoding: control pieces (<s>, </s>, <pad>) give nothing, <unk> gives
unk_surface (" \u2047 "), U+2581 gives a space, and the leading U+2581 of
the text goes as SentencePiece strips it (every one with
remove_extra_whitespaces, else one with add_dummy_prefix).

Where the two libraries still differ (tests/e2e/hf_tokenizer.sh finds
neither on the demo corpora's test splits):
  - Unigram: SentencePiece sums piece scores along the lattice in float32,
    tokenizers in float64, so where two segmentations score the same in
    exact arithmetic ("SSS" as S + SS or SS + S) rounding may make
    SentencePiece take the other (12 of the 179,092 lines of both demo
    corpora under a 4,000-piece unigram model of the German messages);
  - tokenizers applies the precompiled map per grapheme cluster (whole
    when shorter than 6 bytes, else character by character) where
    SentencePiece takes the longest match: a letter with several combining
    marks may normalise otherwise;
  - BPE: a line that is nothing but one user-defined symbol (above), and
    two pairs that merge into the same piece, which SentencePiece takes
    leftmost first and tokenizers in the order of its merge list.
Control pieces are the tokenizer's special tokens, so, as for every
SentencePiece model converted for transformers, text that spells one
literally ("<s>", "</s>", "<pad>", or "<unk>" in a Unigram model) reads
as that id, where SentencePiece would read the characters.

What does not convert exactly is refused (convertible): byte fallback,
unused pieces, other model types (word, char), whitespace as a suffix,
unescaped whitespace, a denormalizer.
"""

import base64
import re
import struct

# ModelProto.SentencePiece.Type
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# TrainerSpec.ModelType
UNIGRAM, BPE = 1, 2
MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}
SPACE = "\u2581"  # what SentencePiece writes for a space
FLT_MIN = struct.unpack("<f", struct.pack("<I", 0x00800000))[0]  # smallest normal float32


class ModelError(Exception):
    """Bytes that are no SentencePiece model: one line."""


def _varint(data, pos):
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ModelError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ModelError("varint longer than 10 bytes")


def _fields(data):
    """(field number, value) of each field of a protobuf message: an int for
    a varint, bytes for a length-delimited field, a float for a 32-bit one
    (the only 32-bit fields read here are floats); 64-bit fields are
    skipped."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
            continue
        elif wire == 2:
            n, pos = _varint(data, pos)
            if pos + n > len(data):
                raise ModelError(f"field {number} runs past the end of its message")
            value, pos = data[pos:pos + n], pos + n
        elif wire == 5:
            if pos + 4 > len(data):
                raise ModelError(f"field {number} runs past the end of its message")
            value, pos = struct.unpack("<f", data[pos:pos + 4])[0], pos + 4
        else:
            raise ModelError(f"field {number} has wire type {wire}")
        if pos > len(data):
            raise ModelError(f"field {number} runs past the end of its message")
        yield number, value


def _int32(value):
    """A varint read back as the int32 it encodes (negative ones take ten bytes)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _utf8(value, what):
    try:
        return value.decode("utf-8")
    except (UnicodeDecodeError, AttributeError):
        raise ModelError(f"{what} is not UTF-8 text") from None


class SentencePieceModel:
    """What encoding and decoding depend on; defaults as in the proto."""

    def __init__(self):
        self.pieces = []  # (text, score, type), the id is the index
        self.model_type = UNIGRAM
        self.byte_fallback = False
        self.treat_whitespace_as_suffix = False
        self.unk_surface = " \u2047 "
        self.add_dummy_prefix = True
        self.remove_extra_whitespaces = True
        self.escape_whitespaces = True
        self.precompiled_charsmap = b""
        self.normalizer_name = ""
        self.denormalizer_charsmap = b""
        self.ids = {}  # trainer_spec's unk_id, bos_id, eos_id, pad_id

    def ids_of(self, kind):
        return [i for i, (_, _, t) in enumerate(self.pieces) if t == kind]


def read_model(data):
    """The SentencePieceModel of serialized ModelProto bytes (ModelError
    for bytes that are none)."""
    model = SentencePieceModel()
    model.ids = {"unk": 0, "bos": 1, "eos": 2, "pad": -1}
    if not data:
        raise ModelError("empty")
    for number, value in _fields(bytes(data)):
        if number == 1:  # pieces
            if not isinstance(value, bytes):
                raise ModelError("a piece is not a message")
            text, score, kind = None, 0.0, NORMAL
            for n, v in _fields(value):
                if n == 1:
                    text = _utf8(v, f"piece {len(model.pieces)}")
                elif n == 2:
                    score = float(v)
                elif n == 3:
                    kind = v
            if not text:
                raise ModelError(f"piece {len(model.pieces)} is empty")
            model.pieces.append((text, score, kind))
        elif number == 2 and isinstance(value, bytes):  # trainer_spec
            names = {40: "unk", 41: "bos", 42: "eos", 43: "pad"}
            for n, v in _fields(value):
                if n == 3:
                    model.model_type = v
                elif n == 35:
                    model.byte_fallback = bool(v)
                elif n == 24:
                    model.treat_whitespace_as_suffix = bool(v)
                elif n == 44:
                    model.unk_surface = _utf8(v, "unk_surface")
                elif n in names:
                    model.ids[names[n]] = _int32(v)
        elif number == 3 and isinstance(value, bytes):  # normalizer_spec
            for n, v in _fields(value):
                if n == 1:
                    model.normalizer_name = _utf8(v, "the normalizer's name")
                elif n == 2:
                    model.precompiled_charsmap = bytes(v)
                elif n == 3:
                    model.add_dummy_prefix = bool(v)
                elif n == 4:
                    model.remove_extra_whitespaces = bool(v)
                elif n == 5:
                    model.escape_whitespaces = bool(v)
        elif number == 5 and isinstance(value, bytes):  # denormalizer_spec
            for n, v in _fields(value):
                if n == 2:
                    model.denormalizer_charsmap = bytes(v)
    if not model.pieces:
        raise ModelError("holds no pieces")
    return model


def convertible(model):
    """Why `model` does not convert exactly into tokenizer.json (a list of
    reasons; empty when it does)."""
    why = []
    if model.model_type not in (UNIGRAM, BPE):
        name = MODEL_TYPES.get(model.model_type, str(model.model_type))
        why.append(f"a {name} model (only unigram and bpe convert)")
    if model.byte_fallback or model.ids_of(BYTE):
        why.append("byte fallback (tokenizers would split unknown characters otherwise)")
    if model.ids_of(UNUSED):
        why.append("unused pieces")
    if model.treat_whitespace_as_suffix:
        why.append("whitespace as a suffix (treat_whitespace_as_suffix)")
    if not model.escape_whitespaces:
        why.append("unescaped whitespace (escape_whitespaces false)")
    if model.denormalizer_charsmap:
        why.append("a denormalizer")
    unknown = model.ids_of(UNKNOWN)
    if unknown != [model.ids["unk"]]:
        why.append(f"unknown pieces at ids {unknown}, unk_id {model.ids['unk']}")
    texts = [p[0] for p in model.pieces]
    if len(set(texts)) != len(texts):
        why.append("a piece listed twice")
    # tokenizers scores unknown characters below the lowest score of all its
    # pieces; SentencePiece below the lowest of the normal pieces.
    normal = [s for _, s, t in model.pieces if t == NORMAL]
    if normal and min(s for _, s, _ in model.pieces) < min(normal):
        why.append("a special piece scored below every normal piece")
    if any(" " in t for t, _, k in model.pieces if k == USER_DEFINED):
        why.append("a user-defined symbol holding a space")
    charsmap = model.precompiled_charsmap
    if charsmap and (len(charsmap) <= 4 or struct.unpack("<I", charsmap[:4])[0] >= len(charsmap)):
        why.append("a damaged precompiled character map")
    return why


def _user_defined_score(model, text):
    """The score SentencePiece's Unigram lattice gives a user-defined
    symbol: (its length in bytes) * (the highest normal score, at least
    FLT_MIN) - 0.1, which no path of normal pieces beats."""
    top = max([FLT_MIN] + [s for _, s, t in model.pieces if t == NORMAL])
    length_times_top = struct.unpack("<f", struct.pack("<f", len(text.encode()) * top))[0]
    return length_times_top - 0.1


def _merges(model):
    """BPE merges for tokenizers, most urgent first. SentencePiece merges the
    adjacent pair whose concatenation is the best-scored piece; normal
    pieces alone take part (it never splits or forms the others)."""
    normal = {t: i for i, (t, _, k) in enumerate(model.pieces) if k == NORMAL}
    ranked = sorted(normal.items(), key=lambda item: (-model.pieces[item[1]][1], item[1]))
    merges = []
    for text, _ in ranked:
        splits = [(text[:k], text[k:]) for k in range(1, len(text))]
        splits = [(a, b) for a, b in splits if a in normal and b in normal]
        splits.sort(key=lambda p: (normal[p[0]], normal[p[1]]))
        merges += [f"{a} {b}" for a, b in splits]
    return merges


def _added(text, index, special, normalized):
    return {"id": index, "content": text, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def added_tokens(model):
    """tokenizer.json's added tokens: the control pieces (special, matched
    in the raw text), and with BPE the user-defined symbols (matched in the
    normalized text, as SentencePiece matches them after normalizing)."""
    added = []
    for i, (text, _, kind) in enumerate(model.pieces):
        if kind == CONTROL:
            added.append(_added(text, i, True, False))
        elif kind == USER_DEFINED and model.model_type == BPE:
            added.append(_added(text, i, False, True))
    return added


def _replace(pattern, content, regex=True):
    return {"type": "Replace", "pattern": {"Regex" if regex else "String": pattern},
            "content": content}


def tokenizer_json(model, bos_id):
    """The tokenizer.json document of a convertible `model`: the text's ids
    as SentencePiece gives them, with `bos_id` put first (as mpiformer's lm
    reads them) by the post-processor, and decoding as SentencePiece's."""
    pieces = model.pieces
    normalizers = []
    if model.precompiled_charsmap:
        normalizers.append({"type": "Precompiled", "precompiled_charsmap":
                            base64.b64encode(model.precompiled_charsmap).decode()})
    if model.remove_extra_whitespaces:
        normalizers += [_replace(r"\A +| +\z", ""), _replace(" {2,}", " ")]
    user_defined = [t for t, _, k in pieces if k == USER_DEFINED]
    if model.add_dummy_prefix:
        if model.model_type == BPE and user_defined:
            # The added tokens' own text goes through this normalizer before
            # it is matched: a line that is exactly one of them keeps no prefix.
            alone = "|".join(re.escape(t) for t in user_defined)
            normalizers.append(_replace(rf"\A(?=[\s\S])(?!(?:{alone})\z)", SPACE))
        else:
            normalizers.append({"type": "Prepend", "prepend": SPACE})
    normalizers.append(_replace(" ", SPACE, regex=False))

    if model.model_type == UNIGRAM:
        vocab = [[t, _user_defined_score(model, t) if k == USER_DEFINED else s]
                 for t, s, k in pieces]
        tokenizer_model = {"type": "Unigram", "unk_id": model.ids["unk"], "vocab": vocab,
                           "byte_fallback": False}
    else:
        tokenizer_model = {"type": "BPE", "dropout": None,
                           "unk_token": pieces[model.ids["unk"]][0],
                           "continuing_subword_prefix": None, "end_of_word_suffix": None,
                           "fuse_unk": True, "byte_fallback": False,
                           "vocab": {t: i for i, (t, _, _) in enumerate(pieces)},
                           "merges": _merges(model)}

    control = "|".join(re.escape(pieces[i][0]) for i in model.ids_of(CONTROL))
    decoders = []
    if control:  # left in by skip_special_tokens=False: SentencePiece shows nothing
        decoders.append(_replace(rf"\A(?:{control})\z", ""))
    unk = re.escape(pieces[model.ids["unk"]][0])
    decoders += [_replace(rf"\A{unk}\z", model.unk_surface), {"type": "Fuse"}]
    # SentencePiece strips a leading U+2581 from each piece while the text
    # is still empty (remove_extra_whitespaces), or from the first one.
    if model.remove_extra_whitespaces or model.add_dummy_prefix:
        strip = (1 << 31) - 1 if model.remove_extra_whitespaces else 1
        decoders.append({"type": "Strip", "content": SPACE, "start": strip, "stop": 0})
    decoders.append(_replace(SPACE, " ", regex=False))

    bos = pieces[bos_id][0]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens(model),
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        },
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": tokenizer_model,
    }
