"""TextStream: tokens to final text as they arrive, with stop strings and characters split across tokens."""

import pytest

from draftwise.serve.text import REPLACEMENT, TextStream

CORPUS = ["hello world stop here", "the end of the text", "hello hello world"]


@pytest.fixture(scope="module")
def tok():
    """A small byte-level BPE tokenizer (GPT-2's scheme): characters outside its corpus are split into byte tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<eos>"],
        show_progress=False,
    )
    raw.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")


def feed(stream: TextStream, ids: list[int], step: int = 1) -> list[str]:
    """The pieces `add` gives out for `ids` fed `step` tokens at a time, then what `finish` gives."""
    pieces = [stream.add(ids[i : i + step]) for i in range(0, len(ids), step)]
    return pieces + [stream.finish()]


def test_without_stop_strings_the_pieces_are_the_decoded_text_given_out_at_once(tok):
    ids = tok.encode("hello world the end")
    assert len(ids) > 3
    s = TextStream(tok)
    pieces = feed(s, ids)
    assert "".join(pieces) == tok.decode(ids) == "hello world the end"
    assert pieces[-1] == ""  # nothing held back without stop strings and with whole characters
    assert all(pieces[:-1]) and not s.stopped


@pytest.mark.parametrize("text", ["héllo wörld", "hello 🙂 world", "日本 the end", "é🙂"])
def test_a_character_split_across_tokens_is_held_until_its_last_byte(tok, text):
    ids = tok.encode(text)
    assert len(ids) > len(text.split())  # some character really is split across byte tokens
    assert any(REPLACEMENT in tok.decode(ids[:i]) for i in range(1, len(ids)))
    s = TextStream(tok)
    pieces = feed(s, ids)
    assert not any(REPLACEMENT in p for p in pieces)
    assert "".join(pieces) == text


def test_a_split_character_is_given_out_once_complete(tok):
    ids = tok.encode("h🙂")
    s = TextStream(tok)
    assert s.add(ids[:1]) == "h"
    assert [s.add([t]) for t in ids[1:-1]] == [""] * (len(ids) - 2)  # the emoji's first bytes: nothing yet
    assert s.add(ids[-1:]) == "🙂"


def test_a_stop_string_across_token_boundaries_cuts_the_text_before_it(tok):
    ids = tok.encode("hello STOP and more")
    s = TextStream(tok, ("STOP",))
    pieces = []
    for t in ids:
        pieces.append(s.add([t]))
        if s.stopped:
            break
    assert s.stopped and "".join(pieces) + s.finish() == "hello "
    assert len(pieces) < len(ids)  # it stopped at the token that completed "STOP"
    assert not any("S" in p for p in pieces)  # the start of the stop string was never given out


def test_a_partial_stop_string_is_held_back_then_released(tok):
    ids = tok.encode("hello STAB STOP")
    s = TextStream(tok, ("STOP",))
    given = ""
    for t in ids:
        given += s.add([t])
        assert "hello STAB ".startswith(given)  # "S", "ST", "STO" (a possible start of "STOP") wait
        if s.stopped:
            break
    assert s.stopped and given + s.finish() == "hello STAB "


def test_held_back_text_comes_out_at_the_end_when_no_stop_string_appears(tok):
    ids = tok.encode("hello world ST")
    s = TextStream(tok, ("STOP", "xyz"))
    pieces = feed(s, ids)
    assert pieces[-1].endswith("ST")  # held back to the end: it could have begun "STOP"
    assert "".join(pieces) == "hello world ST" and not s.stopped


@pytest.mark.parametrize("stops", [("world", "lo"), ("lo", "world"), ("orl", "hello w", "lo w")])
def test_the_earliest_stop_string_wins(tok, stops):
    text = "hello world the end"
    ids = tok.encode(text)
    first = min(text.find(x) for x in stops)
    for step in (1, 3, len(ids)):  # one token at a time, a few per round, all in one round
        s = TextStream(tok, stops)
        assert "".join(feed(s, ids, step)) == text[:first] and s.stopped


def test_a_stop_string_inside_one_token(tok):
    ids = tok.encode("hello world")
    assert len(ids) <= 3  # "world" is one merged token here
    s = TextStream(tok, ("orl",))
    assert "".join(feed(s, ids)) == "hello w"


def test_a_stop_string_at_the_very_start_gives_nothing(tok):
    s = TextStream(tok, ("hel",))
    assert "".join(feed(s, tok.encode("hello world"))) == "" and s.stopped


def test_nothing_more_comes_out_once_stopped(tok):
    s = TextStream(tok, ("world",))
    s.add(tok.encode("hello world"))
    assert s.stopped
    assert s.add(tok.encode(" the end")) == "" and s.finish() == "" and s.text == "hello "


def test_a_stop_string_split_over_a_multibyte_character(tok):
    ids = tok.encode("hello wé the")
    s = TextStream(tok, ("é",))
    assert "".join(feed(s, ids)) == "hello w" and s.stopped


def test_empty_stop_strings_are_ignored_and_special_tokens_skipped(tok):
    eos = tok.convert_tokens_to_ids("<eos>")
    s = TextStream(tok, ("",))
    assert s.stop == ()
    assert "".join(feed(s, tok.encode("hello") + [eos])) == "hello"


class Spelled:
    """A fake tokenizer: token i is the character chr(i); `decode` as transformers' tokenizers call it."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


def test_with_a_fake_tokenizer_the_pieces_concatenate_to_the_text_before_the_stop():
    text = "abcabcXYZabc"
    for stops in [("XYZ",), ("cX", "ZZZZ"), ("bcXY", "abcX")]:
        s = TextStream(Spelled(), stops)
        out = "".join(feed(s, [ord(c) for c in text]))
        assert out == text[: min(text.find(x) for x in stops if x in text)] and s.stopped
