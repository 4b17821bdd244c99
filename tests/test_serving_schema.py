"""Request parsing for `POST /translate`: bytes to JSON, types, limits; every refusal one line."""

from __future__ import annotations

import pytest

from aiayn.serving.schema import RequestError, decode_json, parse_translate
from aiayn.serving.settings import ServeSettings, decoding_threads

SETTINGS = ServeSettings(max_chars=40, max_sentences=3, max_queue=8, max_beam=6)


def refused(obj, settings=SETTINGS) -> RequestError:
    with pytest.raises(RequestError) as e:
        parse_translate(obj, settings, default_beam=4)
    assert "\n" not in e.value.message
    return e.value


def test_decode_json_accepts_utf8_json_only():
    assert decode_json('{"q": "Grüße"}'.encode()) == {"q": "Grüße"}
    for body, status, words in [
        (b'{"q": "\xff"}', 400, "not valid UTF-8 (byte 7)"),
        (b'{"q": "x"', 400, "malformed JSON"),
        (b'{"q": "x"} trailing', 400, "malformed JSON"),
        (b"   ", 400, "empty request body"),
        (b'{"alpha": NaN}', 400, "NaN is not JSON"),
        (b"[" * 100_000, 400, "malformed JSON"),  # nested too deeply for the parser
    ]:
        with pytest.raises(RequestError) as e:
            decode_json(body)
        assert e.value.status == status and words in e.value.message, (body[:20], e.value.message)


def test_parse_accepts_a_text_or_a_list():
    one = parse_translate({"q": "A dog."}, SETTINGS, 4)
    assert one.texts == ["A dog."] and one.nbest == 1 and one.beam_size is None
    many = parse_translate({"q": ["a", "", "b"], "beam_size": 6, "nbest": 6, "alpha": 0}, SETTINGS, 4)
    assert many.texts == ["a", "", "b"] and many.alpha == 0.0


@pytest.mark.parametrize("obj, status, words", [
    ([1, 2], 400, "request: Input should be a valid dictionary"),
    ({}, 400, "q: required"),
    ({"q": 3}, 400, "q: must be a string or a list of strings"),
    ({"q": ["a", None]}, 400, "q: item 1 is NoneType, not a string"),
    ({"q": "a", "beam_size": "4"}, 400, "beam_size: Input should be a valid integer"),
    ({"q": "a", "beam_size": 4.0}, 400, "beam_size: Input should be a valid integer"),
    ({"q": "a", "alignment": 1}, 400, "alignment: Input should be a valid boolean"),
    ({"q": "a", "nbets": 2}, 400, "nbets: unknown field"),
    ({"q": ""}, 400, "q: empty text"),
    ({"q": "  "}, 400, "q: empty text"),
    ({"q": []}, 400, "q: empty list"),
    ({"q": ["a"] * 4}, 413, "4 texts; this server takes at most 3"),
    ({"q": "x" * 41}, 413, "41 characters; this server takes at most 40"),
    ({"q": ["x" * 20, "y" * 21]}, 413, "41 characters"),
    ({"q": "two\nlines"}, 400, "q[0]: a line break"),
    ({"q": ["ok", "\ud800"]}, 400, "q[1]: not valid Unicode"),
    ({"q": "a", "beam_size": 0}, 400, "beam_size: must be between 1 and 6, got 0"),
    ({"q": "a", "beam_size": 7}, 400, "beam_size: must be between 1 and 6, got 7"),
    ({"q": "a", "nbest": 5}, 400, "nbest: must be between 1 and the beam size 4, got 5"),
    ({"q": "a", "beam_size": 2, "nbest": 3}, 400, "beam size 2, got 3"),
    ({"q": "a", "alpha": -0.5}, 400, "alpha: must be between 0 and 10"),
])
def test_parse_refuses_with_one_line(obj, status, words):
    e = refused(obj)
    assert e.status == status and words in e.message, e.message


def test_settings_are_validated():
    with pytest.raises(ValueError, match="max_queue"):
        ServeSettings(max_sentences=10, max_queue=5)
    with pytest.raises(ValueError, match="timeout_s"):
        ServeSettings(timeout_s=0)
    with pytest.raises(ValueError, match="batch_tokens"):
        ServeSettings(batch_tokens=0)
    assert ServeSettings().max_body_bytes > 12 * ServeSettings().max_chars


def test_the_server_leaves_one_core_to_its_event_loop():
    assert [decoding_threads(n) for n in (1, 2, 3, 16)] == [1, 1, 2, 15]
