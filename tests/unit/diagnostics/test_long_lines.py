"""Long source lines are cut around the caret (about 120 columns, ``...`` where cut), as rustc does."""

from modeldsl.diagnostics import SHOWN_COLUMNS, Diagnostic, Source, Span, cut_around


def caret_lines(text: str, column: int, end_column: int) -> list[str]:
    span = Span(Source("config.json", text), 1, column, 1, end_column)
    return span.caret_lines().splitlines()


def test_a_short_line_is_shown_whole():
    shown, caret = caret_lines('  "vocab_size": 12,', 17, 19)
    assert shown == '    1 |   "vocab_size": 12,'
    assert caret == "      |                 ^^"


def test_a_5000_digit_number_is_cut_around_its_start_and_its_carets_fit_the_window():
    digits = "9" * 5000
    text = f'  "vocab_size": {digits},'
    shown, caret = caret_lines(text, 17, 17 + len(digits))
    body = shown.split(" | ", 1)[1]
    assert len(body) <= SHOWN_COLUMNS and body.endswith("...") and not body.startswith("...")
    assert '"vocab_size": 999' in body
    carets = caret.split("| ", 1)[1]
    assert carets.lstrip(" ").startswith("^") and len(carets) <= SHOWN_COLUMNS
    assert body[len(carets) - len(carets.lstrip(" "))] == "9"  # the first caret is under the number's first digit


def test_a_span_far_into_a_long_line_keeps_the_words_around_it_and_both_cuts_show():
    text = "x" * 3000 + " bad_word " + "y" * 3000
    start = text.index("bad_word")
    shown, caret_at, width = cut_around(text, start, start + len("bad_word"))
    assert shown.startswith("...") and shown.endswith("...") and len(shown) <= SHOWN_COLUMNS
    assert shown[caret_at:caret_at + width] == "bad_word"


def test_a_span_at_the_end_of_a_long_line_is_shown():
    text = "a" * 500 + "END"
    shown, caret_at, width = cut_around(text, 500, 503)
    assert shown.startswith("...") and not shown.endswith("...")
    assert shown[caret_at:caret_at + width] == "END"


def test_the_rendered_diagnostic_holds_no_line_longer_than_the_window_plus_its_gutter():
    text = "z" * 10_000
    diagnostic = Diagnostic("E036", "too long", Span(Source("m.module", text), 1, 5000, 1, 5001))
    assert max(len(line) for line in diagnostic.render().splitlines()) <= SHOWN_COLUMNS + len("    1 | ")
