"""N-Triples files through the columnar reader (kgpipe.data.columnar_nt) give exactly what the
line parser gives: the same ids, vocabulary, reports (literals dropped, lines) and fingerprint,
or the same error with the same line."""

from __future__ import annotations

import gzip
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from test_columnar import compare
from test_data_formats import NT as NT_BYTES

from kgpipe.config import DataConfig

NT = NT_BYTES.decode() + "<http://ex.org/b> <http://ex.org/knows> <http://ex.org/c> .\n"
ESCAPED = r"""<http://ex.org/Caf\u00E9> <http://ex.org/p> <http://ex.org/b> .
<http://ex.org/Caf\U000000e9> <http://ex.org/p> "caf\u00e9"@EN .
<http://ex.org/Café> <http://ex.org/p> "café"@en .
<http://ex.org/b> <http://ex.org/p> "say \"hi\"\n\u0041\t" .
<http://ex.org/b> <http://ex.org/p> "x"^^<http://www.w3.org/2001/XMLSchema#string> .
<http://ex.org/\uD83D\uDE00> <http://ex.org/p> <http://ex.org/\U0001F600> .
"""
OK = "<http://x> <http://p> <http://y> .\n"

CASES: dict[str, dict[str, str | bytes]] = {
    "plain": {"train": NT},
    "escapes": {"train": ESCAPED + OK},
    "crlf and a bom": {"train": "\ufeff" + NT.replace("\n", "\r\n")},
    "no final newline": {"train": NT.rstrip("\n")},
    "duplicates": {"train": NT + NT},
    "valid and test with unseen terms": {
        "train": NT,
        "valid": "<http://ex.org/a> <http://ex.org/knows> <http://ex.org/z> .\n",
        "test": '<http://ex.org/b> <http://ex.org/knows> _:b1 .\n<http://a> <http://p> "l" .\n',
    },
    "a malformed statement": {"train": OK + "<http://a> <http://p> .\n" + OK},
    "turtle": {"train": "@prefix ex: <http://ex.org/> .\n" + OK},
    "a bad escape": {"train": OK + '<http://a> <http://p> "x\\q" .\n'},
    "an empty iri": {"train": OK + "<> <http://p> <http://c> .\n"},
    "half a utf-16 pair": {"train": OK + "<http://a\\uD83D> <http://p> <http://c> .\n"},
    "invalid utf-8 after a malformed statement": {
        "train": (OK + "<http://a> .\n" + OK).encode() + b"<http://\xff> <http://p> <http://c> .\n"
    },
    "invalid utf-8 before a malformed statement": {
        "train": OK.encode() + b"<http://\xff> <http://p> <http://c> .\n<x> .\n"
    },
    "a lone carriage return": {"train": OK + "<http://a> <http://p> <http://c> .\r" + OK},
    "empty": {"train": ""},
    "comments only": {"train": "# nothing\n\n"},
    "only literals": {"train": '<http://a> <http://p> "x" .\n'},
    "a valid split of only literals": {"train": NT, "valid": '<http://a> <http://p> "x" .\n'},
}


def _write(tmp_path: Path, files: dict[str, str | bytes], gz: bool) -> dict[str, str]:
    urls = {}
    for split, text in files.items():
        data = text.encode() if isinstance(text, str) else text
        path = tmp_path / (f"{split}.nt.gz" if gz else f"{split}.nt")
        path.write_bytes(gzip.compress(data) if gz else data)
        urls[split] = str(path)
    return urls


#: cases the columnar reader hands to the line parser: no statement kept
FALLS_BACK = {"only literals", "a valid split of only literals"}


@pytest.mark.parametrize("literals", ["drop", "keep"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_ntriples_columnar_equals_line_parser(
    case: str, literals: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An N-Triples file went to the line parser, whole (an RDF dump of 100M statements is
    ~25 GB of Python strings); it is now read a batch of statements at a time."""
    urls = _write(tmp_path, CASES[case], gz=case == "plain")
    out, seen = compare(DataConfig(**urls, literals=literals), monkeypatch)
    if not isinstance(out, str):
        fell_back = case in FALLS_BACK and literals == "drop"
        assert seen == ([] if fell_back else ["columnar"]), seen


def test_many_batches_and_the_line_of_an_unseen_term(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [
        f"<http://e/{i % 997}> <http://r/{i % 13}> <http://e/{(i * 7) % 1009}> ."
        if i % 5
        else f'<http://e/{i % 997}> <http://r/{i % 13}> "{i}" .'
        for i in range(30_000)
    ]
    kw: dict[str, Any] = {"block_size": "1MiB", "unseen": "error"}  # 8,192 statements a batch
    test = (
        "# c\n<http://e/1> <http://r/1> <http://e/2> .\n\n<http://q> <http://r/1> <http://e/1> .\n"
    )
    urls = _write(tmp_path, {"train": "\n".join(rows) + "\n", "test": test}, gz=False)
    out, seen = compare(DataConfig(**urls, **kw), monkeypatch)
    assert seen == ["columnar"]
    assert "line 4" in out and "http://q" in out, out
    del urls["test"]
    out, _ = compare(DataConfig(**urls, block_size="1MiB"), monkeypatch)
    assert out.reports["train"].literals_dropped == 6_000


@pytest.mark.parametrize("room", [True, False])
def test_each_statement_is_parsed_once_where_there_is_room(
    room: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The columnar reader reads a file twice (its labels, then its ids): each N-Triples line
    was parsed twice, in Python, 2.2 times the line parser's time. The first read's statements
    are now kept in a temporary file in data.spill_dir for the second; without room there,
    both reads parse, with the same result."""
    import kgpipe.data.columnar_nt as columnar_nt

    calls = []
    real = columnar_nt._fast_block

    def counting(*args: Any) -> Any:
        calls.append(args[1])
        return real(*args)

    monkeypatch.setattr(columnar_nt, "_fast_block", counting)
    urls = _write(tmp_path, {"train": NT}, gz=False)
    spill = tmp_path / ("spill" if room else "missing")
    if room:
        spill.mkdir()
    _out, seen = compare(DataConfig(**urls, spill_dir=str(spill)), monkeypatch)
    assert seen == ["columnar"]
    assert calls == ([1] if room else [1, 1]), calls  # the file is one block
    if room:
        assert list(spill.iterdir()) == []  # nameless, and closed after the second read


def test_the_whitespace_spelled_for_re2_is_pythons() -> None:
    """RE2's \\s is ASCII whitespace; the line parser's (Python's) is Unicode's: a blank node
    may not hold a no-break space for either."""
    from kgpipe.data.columnar_nt import PY_SPACE

    assert set(PY_SPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}


#: pieces of statements: most read in bulk, the rest by the line parser's statement()
_SUBJECTS = ["<http://e/{n}>", "_:b{n}", "_:b.{n}", "<http://e/caf\\u00e9{n}>", "<http://é/{n}>",
             "_:b\u00e9{n}", "<http://e/{n}>", "<http://e/{n}>"]  # fmt: skip
_OBJECTS = [*_SUBJECTS, '"{n}"', '"{n} x"@en', '"{n}"@EN-gb', '"{n}"^^<http://t>',
            '"{n}"^^<http://www.w3.org/2001/XMLSchema#string>', '"a\\"{n}"', '"<>{n}"']  # fmt: skip
_GAPS = [" "] * 12 + ["  ", "\t", ""]
_ENDS = [" .\r\n", " . # c\n", "\t.\n", ".\n", " . \n"]
_SKIPPED = ["# a comment\n", "\n", "\u00a0\n"]
_MALFORMED = ["<http://a> <http://p> .\n", "<> <http://p> <http://c> .\n", '<http://a> <http://p> "x\\q" .\n',
              "_:a. <http://p> <http://c> .\n", "<http://a> <http://p> <http://c> .\r\r\n",
              "_:b\u00a0x <http://p> <http://c> .\n", "_:b\u2003x <http://p> <http://c> .\n"]  # fmt: skip


def _statement(rng: Any, n: int) -> str:
    s, o = rng.choice(_SUBJECTS), rng.choice(_OBJECTS)
    gap = rng.choice(_GAPS) if rng.random() < 0.2 else " "
    end = rng.choice(_ENDS) if rng.random() < 0.2 else " .\n"
    return f"{s.replace('{n}', str(n % 300))}{gap}<http://r/{n % 7}>{gap}{o.replace('{n}', str(n % 500))}{end}"


def _random_lines(seed: int) -> list[str]:
    rng = random.Random(seed)
    lines = [_statement(rng, n) for n in range(4_000)]
    for _ in range(40):
        lines.insert(rng.randrange(len(lines)), rng.choice(_SKIPPED))
    return lines


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("literals", ["drop", "keep"])
def test_random_files_read_in_bulk_equal_the_line_parser(
    seed: int, literals: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines of the shapes RDF tools write are read by pyarrow's kernels in bulk (several
    times the line parser's speed), the rest by its statement(), in the file's order: over
    files of both mixed, across blocks, the same data set."""
    lines = _random_lines(seed)
    text = ("\ufeff" if seed == 2 else "") + "".join(lines)
    urls = _write(tmp_path, {"train": text, "test": "".join(lines[:50])}, gz=False)
    out, seen = compare(DataConfig(**urls, literals=literals, block_size="64KiB"), monkeypatch)
    assert not isinstance(out, str), out
    assert seen == ["columnar"]


@pytest.mark.parametrize("bad", range(len(_MALFORMED)))
@pytest.mark.parametrize("literals", ["drop", "keep"])
def test_a_malformed_line_among_lines_read_in_bulk_is_the_line_parsers_error(
    bad: int, literals: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement the line parser refuses is never read in bulk: the same error, same line."""
    lines = _random_lines(bad)
    lines.insert(2_000 + bad * 100, _MALFORMED[bad])
    urls = _write(tmp_path, {"train": "".join(lines)}, gz=False)
    out, _ = compare(DataConfig(**urls, literals=literals, block_size="64KiB"), monkeypatch)
    assert isinstance(out, str) and f"line {2_001 + bad * 100}:" in out, out


_TEMPORARY = tempfile.TemporaryFile


class _FullDisk:
    """A temporary file whose buffered bytes meet a full disk when flushed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._f = _TEMPORARY()

    def write(self, data: Any) -> int:
        return self._f.write(data)

    def flush(self) -> None:
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self._f.close()


def test_a_full_spill_folder_at_the_last_batch_parses_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last batch stayed in the file's buffer until the second read's seek wrote it: a
    full disk there failed staging ("cannot read: [Errno 28]") instead of parsing again."""
    import kgpipe.data.columnar_nt as columnar_nt

    monkeypatch.setattr(columnar_nt.tempfile, "TemporaryFile", _FullDisk)
    out, seen = compare(DataConfig(**_write(tmp_path, {"train": NT}, gz=False)), monkeypatch)
    assert seen == ["columnar"] and not isinstance(out, str), out


def test_the_caches_are_closed_when_a_later_split_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parsed train file's cache stayed open (its disk space held) while the error lived."""
    import kgpipe.data.reading as reading

    made: list[Any] = []

    class Tracked(reading.NtParsed):  # type: ignore[name-defined,misc]
        def __init__(self, folder: str | None) -> None:
            super().__init__(folder)
            made.append(self)

    monkeypatch.setattr(reading, "NtParsed", Tracked)
    urls = _write(tmp_path, {"train": NT, "valid": OK + "bad\n"}, gz=False)
    out, _ = compare(DataConfig(**urls), monkeypatch)
    assert "valid.nt, line 2: malformed N-Triples statement" in out
    assert len(made) == 2 and all(m._file is None for m in made)


@pytest.mark.parametrize("compression", ["xz", "bz2"])
def test_a_truncated_file_says_the_same_through_both_readers(
    compression: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed, lzma and bz2 say "Compressed file ended ..."; read whole, "Compressed data"."""
    import bz2
    import lzma

    data = (lzma.compress if compression == "xz" else bz2.compress)((NT * 50).encode())
    path = tmp_path / f"train.nt.{compression}"
    path.write_bytes(data[: len(data) // 2])
    out, _ = compare(DataConfig(train=str(path)), monkeypatch)
    assert isinstance(out, str) and "cannot decompress" in out, out
