"""Reading and parsing triple files: formats, compression, URLs and error messages."""

from __future__ import annotations

import bz2
import gzip
import lzma
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from kgpipe.config import DataConfig
from kgpipe.data.dataset import load_dataset
from kgpipe.data.formats import LabeledTriples, detect_format, parse_triples
from kgpipe.data.io import opened, read_bytes, split_compression
from kgpipe.errors import DataError

TSV = b"a\tr1\tb\nb\tr2\tc\n"


def parse(data: bytes, fmt: str = "tsv", **kw: object) -> LabeledTriples:
    opts: dict[str, object] = {
        "delimiter": None,
        "header": False,
        "columns": None,
        "literals": "drop",
    }
    opts.update(kw)
    return parse_triples(data, source="g.tsv", fmt=fmt, **opts)  # type: ignore[arg-type]


def triples(lt: LabeledTriples) -> list[tuple[str, str, str]]:
    return list(zip(lt.heads, lt.relations, lt.tails, strict=True))


def data_error(data: bytes, fmt: str = "tsv", **kw: object) -> DataError:
    with pytest.raises(DataError) as info:
        parse(data, fmt, **kw)
    return info.value


# ---------------------------------------------------------------------------------------------
# io


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("x.tsv.gz", ("x.tsv", "gzip")),
        ("s3://b/x.TXT.BZ2", ("s3://b/x.TXT", "bz2")),
        ("x.nt.xz", ("x.nt", "xz")),
        ("x.csv.zst", ("x.csv", "zstd")),
        ("x.csv.zstd", ("x.csv", "zstd")),
        ("x.tsv", ("x.tsv", None)),
    ],
)
def test_split_compression(url: str, expected: tuple[str, str | None]) -> None:
    assert split_compression(url) == expected


def _zstd(data: bytes, *, checksum: bool = False) -> bytes:
    zstandard = pytest.importorskip("zstandard")
    return zstandard.ZstdCompressor(write_checksum=checksum).compress(data)


def _zstd_checked(data: bytes) -> bytes:  # a flipped byte is found (without, it may not be)
    return _zstd(data, checksum=True)


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        ("", lambda d: d),
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".xz", lzma.compress),
        (".zst", _zstd),
        (".zstd", _zstd),
    ],
)
def test_read_bytes_decompresses(tmp_path: Path, suffix: str, compress) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / f"g.tsv{suffix}"
    path.write_bytes(compress(TSV))
    assert read_bytes(str(path)) == TSV
    assert read_bytes(path.as_uri()) == TSV  # file:// URL


def test_read_bytes_zstd_several_frames(tmp_path: Path) -> None:
    path = tmp_path / "g.tsv.zst"
    path.write_bytes(_zstd(b"a\tr\tb\n") + _zstd(b"c\tr\td\n"))
    assert read_bytes(str(path)) == b"a\tr\tb\nc\tr\td\n"


def test_read_bytes_memory_url() -> None:
    url = f"memory://kgpipe-test-{uuid.uuid4().hex}/g.tsv.gz"
    with fsspec.open(url, "wb") as f:
        f.write(gzip.compress(TSV))
    try:
        assert read_bytes(url) == TSV
    finally:
        fsspec.filesystem("memory").rm(url)


def test_read_bytes_missing_file(tmp_path: Path) -> None:
    url = str(tmp_path / "nope.tsv")
    with pytest.raises(DataError) as info:
        read_bytes(url)
    assert str(info.value) == f"{url}: file not found"
    with pytest.raises(DataError, match="file not found"):
        read_bytes(f"memory://kgpipe-test-{uuid.uuid4().hex}/nope.tsv")


def test_read_bytes_directory(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot read"):
        read_bytes(str(tmp_path))


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress), (".zst", _zstd)],
)
def test_read_bytes_truncated(tmp_path: Path, suffix: str, compress) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / f"g.tsv{suffix}"
    path.write_bytes(compress(TSV * 100)[:-12])
    with pytest.raises(DataError) as info:
        read_bytes(str(path))
    assert str(info.value).startswith(f"{path}: cannot decompress")


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [(".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress), (".zst", _zstd)],
)
def test_a_truncated_file_is_refused_by_the_columnar_reader_too(
    tmp_path: Path, suffix: str, compress: Any
) -> None:
    """A Zstandard file cut inside a frame was read by the columnar reader up to the cut, the
    cut line taken as a triple, and trained on; every compression now stops at the cut."""
    rows = "".join(f"e{i % 997}\tr{i % 7}\te{(i * 13) % 1009}\n" for i in range(30_000))
    whole = compress(rows.encode())
    path = tmp_path / f"g.tsv{suffix}"
    path.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(DataError) as info:
        load_dataset(DataConfig(train=str(path)))
    assert str(info.value).startswith(f"{path}: cannot decompress")
    path.write_bytes(whole + compress(b"x\ty\tz\n"))  # concatenated streams are one file
    distinct = len(set(rows.splitlines())) + 1
    assert load_dataset(DataConfig(train=str(path))).train.shape[0] == distinct


@pytest.mark.parametrize(
    ("suffix", "compress"),
    [
        (".gz", gzip.compress),
        (".bz2", bz2.compress),
        (".xz", lzma.compress),
        (".zst", _zstd_checked),
    ],
)
@pytest.mark.parametrize("fault", ["flipped", "not compressed"])
def test_a_corrupt_stream_is_bad_input_and_a_store_fault_is_not(
    suffix: str, compress: Callable[[bytes], bytes], fault: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Streamed (the columnar reader's way), a corrupt compressed file on a store is a
    DataError at once: gzip's BadGzipFile and bz2's "Invalid data stream" are OSErrors, which
    were taken for the store's faults and retried for ~25 s, then reported as one. A fault
    of the store's own read, in the same stream, still reaches the retries as it was."""
    data = bytearray(compress(TSV * 200) if fault == "flipped" else TSV * 200)
    if fault == "flipped":
        mid = len(data) // 2
        data[mid : mid + 2] = bytes(b ^ 0xFF for b in data[mid : mid + 2])
    url = f"memory://kgpipe-test-{uuid.uuid4().hex}/g.tsv{suffix}"
    fsspec.filesystem("memory").pipe(url, bytes(data))
    try:
        with pytest.raises(DataError, match=r"g\.tsv.*: cannot decompress"), opened(url, None) as f:
            while f.read(1 << 12):
                pass
        fsspec.filesystem("memory").pipe(url, compress(TSV * 200))
        reset = ConnectionResetError(104, "Connection reset by peer")
        real = type(fsspec.filesystem("memory").open(url, "rb"))

        def fail(self, n=-1):  # type: ignore[no-untyped-def]
            raise reset

        monkeypatch.setattr(real, "read", fail)
        with pytest.raises(ConnectionResetError) as info, opened(url, None) as f:
            f.read(1 << 12)
        assert info.value is reset  # as the store raised it: retried by the caller
    finally:
        fsspec.filesystem("memory").rm(url)


def test_read_bytes_zstd_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "g.tsv.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd whatever")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail
    with pytest.raises(DataError) as info:
        read_bytes(str(path))
    assert str(info.value) == f"{path}: install zstandard to read .zst files"


# ---------------------------------------------------------------------------------------------
# format detection


@pytest.mark.parametrize(
    ("url", "fmt"),
    [
        ("g.tsv", "tsv"),
        ("g.txt.gz", "tsv"),
        ("s3://bucket/dir.v2/graph", "tsv"),
        ("g.dat", "tsv"),
        ("G.CSV.bz2", "csv"),
        ("memory://x/g.parquet", "parquet"),
        ("g.pq", "parquet"),
        ("g.nt", "ntriples"),
        ("g.nt.gz", "ntriples"),
    ],
)
def test_detect_format(url: str, fmt: str) -> None:
    assert detect_format(url, "auto") == fmt


def test_detect_format_explicit_wins() -> None:
    assert detect_format("g.csv", "tsv") == "tsv"


# ---------------------------------------------------------------------------------------------
# TSV


def test_tsv_basic() -> None:
    lt = parse(TSV)
    assert triples(lt) == [("a", "r1", "b"), ("b", "r2", "c")]
    assert lt.line_numbers == [1, 2]
    assert lt.literals_dropped == 0


def test_tsv_crlf_blank_lines_comments_bom() -> None:
    data = b"\xef\xbb\xbf# a comment\r\na\tr\tb\r\n\r\n   \r\n#x\ty\tz\r\nc\tr\td\r\n"
    lt = parse(data)
    assert triples(lt) == [("a", "r", "b"), ("c", "r", "d")]
    assert lt.line_numbers == [2, 6]


def test_tsv_mixed_line_endings_and_no_final_newline() -> None:
    lt = parse(b"a\tr\tb\r\nc\tr\td\ne\tr\tf")
    assert triples(lt) == [("a", "r", "b"), ("c", "r", "d"), ("e", "r", "f")]


def test_tsv_keeps_fields_exact() -> None:
    lt = parse(b"New York\tlocated in\t  the USA \n")
    assert triples(lt) == [("New York", "located in", "  the USA ")]


def test_tsv_unicode_labels() -> None:
    lt = parse("Zürich\t位于\tSchweiz\n".encode())
    assert triples(lt) == [("Zürich", "位于", "Schweiz")]


def test_tsv_header_and_named_columns() -> None:
    data = b"# comment\nid\tsubject\tpredicate\tobject\n1\ta\tr\tb\n2\tc\tr\td\n"
    lt = parse(data, header=True, columns=("subject", "predicate", "object"))
    assert triples(lt) == [("a", "r", "b"), ("c", "r", "d")]
    assert lt.line_numbers == [3, 4]


def test_tsv_index_columns_and_custom_delimiter() -> None:
    lt = parse(b"b;r;a;extra\n", delimiter=";", columns=(2, 1, 0))
    assert triples(lt) == [("a", "r", "b")]


def test_tsv_wrong_column_count() -> None:
    err = data_error(b"a\tr\tb\nc\tr\n")
    assert str(err) == "g.tsv, line 2: expected 3 tab-separated fields, found 2\n    'c\\tr'"
    assert (err.source, err.line, err.excerpt) == ("g.tsv", 2, "c\tr")
    err = data_error(b"a\tr\tb\tx\n")
    assert err.problem == "expected 3 tab-separated fields, found 4"


def test_tsv_too_few_columns_for_explicit_columns() -> None:
    err = data_error(b"a\tr\tb\tc\nx\ty\n", columns=(0, 1, 3))
    assert err.line == 2
    assert err.problem == "expected at least 4 tab-separated fields (columns 0, 1, 3), found 2"


def test_csv_too_few_columns_for_columns_by_index() -> None:
    """Columns given by index without a header row: a short CSV row raised IndexError (a
    traceback) where TSV, and CSV with named columns, name the line."""
    err = data_error(b"a,r1,b,1\nb,r1,c,1\nc,r2,a\n", "csv", columns=(0, 1, 3))
    assert err.line == 3
    assert err.problem == "expected at least 4 comma-separated fields (columns 0, 1, 3), found 3"


def test_tsv_empty_field() -> None:
    err = data_error(b"a\tr\tb\n\tr\tc\n")
    assert str(err) == "g.tsv, line 2: empty head field\n    '\\tr\\tc'"
    assert data_error(b"a\t\tb\n").problem == "empty relation field"
    assert data_error(b"a\tr\t\n").problem == "empty tail field"
    assert data_error(b"a\tr\t  \n").problem == "blank (whitespace-only) tail field"


def test_tsv_undecodable_bytes() -> None:
    err = data_error(b"a\tr\tb\nc\tr\xff\td\n")
    assert err.line == 2
    assert err.problem == "not valid UTF-8 (byte 0xff at column 4)"
    assert err.excerpt == "c\tr\ufffd\td"
    assert str(err).startswith("g.tsv, line 2: not valid UTF-8")


@pytest.mark.parametrize("data", [b"", b"\n\n", b"# only a comment\n", b"\xef\xbb\xbf"])
def test_empty_file(data: bytes) -> None:
    err = data_error(data)
    assert str(err) == "g.tsv: no triples found (empty file)"


def test_header_only() -> None:
    err = data_error(b"h\tr\tt\n", header=True)
    assert err.problem == "no triples found (the file has only a header row)"


def test_column_name_not_in_header() -> None:
    err = data_error(b"h\tr\tt\na\tb\tc\n", header=True, columns=("h", "rel", "t"))
    assert err.line == 1
    assert err.problem == "relation column 'rel' not in the header (columns: 'h', 'r', 't')"


def test_column_name_without_header() -> None:
    err = data_error(b"a\tb\tc\n", columns=("h", "r", "t"))
    assert "has no header row" in err.problem


# ---------------------------------------------------------------------------------------------
# CSV


def test_csv_header_named_columns_and_quotes() -> None:
    data = (
        b"\xef\xbb\xbfsource,weight,rel,target\r\n"
        b'"Paris, France",1.0,capital of,France\r\n'
        b"# comment line\r\n"
        b"\r\n"
        b'"multi\nline",2,"say ""hi""",x\r\n'
        b"Berlin,3,capital of,Germany\r\n"
    )
    lt = parse(data, fmt="csv", header=True, columns=("source", "rel", "target"))
    assert triples(lt) == [
        ("Paris, France", "capital of", "France"),
        ("multi\nline", 'say "hi"', "x"),
        ("Berlin", "capital of", "Germany"),
    ]
    assert lt.line_numbers == [2, 5, 7]


def test_csv_default_columns_and_delimiter() -> None:
    assert triples(parse(b"a,r,b\nc,r,d\n", fmt="csv")) == [("a", "r", "b"), ("c", "r", "d")]
    lt = parse(b"a;r;b\n", fmt="csv", delimiter=";")
    assert triples(lt) == [("a", "r", "b")]


def test_csv_errors() -> None:
    err = data_error(b"a,r,b\nParis, France,capital of,France\n", fmt="csv")
    assert (err.line, err.problem) == (2, "expected 3 comma-separated fields, found 4")
    assert err.excerpt == "Paris, France,capital of,France"
    err = data_error(b"a,r,b\nc,,d\n", fmt="csv")
    assert (err.line, err.problem) == (2, "empty relation field")
    err = data_error(b'a,r,b\nc,"r"x,d\n', fmt="csv")
    assert (err.line, err.problem) == (2, "malformed CSV: ',' expected after '\"'")
    err = data_error(b'a,"r\n\nb,c,d\n', fmt="csv")
    assert (err.line, err.problem) == (
        1,
        "malformed CSV: unexpected end of data (read up to line 4)",
    )
    err = data_error(b"", fmt="csv")
    assert err.problem == "no triples found (empty file)"
    err = data_error(b"x,y,z\na,r,b\n", fmt="csv", header=True, columns=("x", "y", "w"))
    assert err.problem == "tail column 'w' not in the header (columns: 'x', 'y', 'z')"


# ---------------------------------------------------------------------------------------------
# Parquet


def _parquet(columns: dict[str, list[object]]) -> bytes:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table(columns), sink)
    return sink.getvalue().to_pybytes()


def test_parquet_default_columns() -> None:
    data = _parquet({"head": ["a", "c"], "relation": ["r", "r"], "tail": ["b", "d"]})
    lt = parse(data, fmt="parquet")
    assert triples(lt) == [("a", "r", "b"), ("c", "r", "d")]
    assert lt.line_numbers == [1, 2]


def test_parquet_custom_columns_and_non_string_values() -> None:
    data = _parquet({"s": [1, 2], "x": [0.5, 0.7], "p": ["r", "q"], "o": [10, 20]})
    lt = parse(data, fmt="parquet", columns=("s", "p", "o"))
    assert triples(lt) == [("1", "r", "10"), ("2", "q", "20")]
    lt = parse(data, fmt="parquet", columns=(0, 2, 3))
    assert triples(lt) == [("1", "r", "10"), ("2", "q", "20")]


def test_parquet_missing_column() -> None:
    data = _parquet({"s": ["a"], "p": ["r"], "o": ["b"]})
    err = data_error(data, fmt="parquet")
    assert err.problem == (
        "head column 'head' not found; available columns: 's', 'p', 'o' "
        "(set data.columns to name the columns)"
    )


def test_parquet_null_and_empty_values() -> None:
    data = _parquet({"head": ["a", "b", None], "relation": ["r", "", "r"], "tail": ["x"] * 3})
    err = data_error(data, fmt="parquet")
    assert err.line == 2
    assert err.problem == "empty relation value in column 'relation' (row 1)"
    data = _parquet({"head": ["a", None], "relation": ["r", "r"], "tail": ["x", "y"]})
    err = data_error(data, fmt="parquet")
    assert (err.line, err.problem) == (2, "null head value in column 'head' (row 1)")


def test_parquet_empty_and_invalid() -> None:
    data = _parquet({"head": [], "relation": [], "tail": []})
    assert data_error(data, fmt="parquet").problem == "no triples found (empty file)"
    assert data_error(b"not parquet", fmt="parquet").problem.startswith("not a valid Parquet file")


# ---------------------------------------------------------------------------------------------
# N-Triples

NT = b"""# a comment
<http://ex.org/a> <http://ex.org/knows> <http://ex.org/b> .
_:b1 <http://ex.org/knows> <http://ex.org/a> .

<http://ex.org/a> <http://ex.org/name> "Alice \\"A\\" Smith"@en .
<http://ex.org/a> <http://ex.org/age> "42"^^<http://www.w3.org/2001/XMLSchema#integer> .
<http://ex.org/b> <http://ex.org/knows> _:b1.  # trailing comment
<http://ex.org/b> <http://ex.org/name> "Bob" .
"""


def test_ntriples_drop_literals() -> None:
    lt = parse(NT, fmt="ntriples", literals="drop")
    assert triples(lt) == [
        ("http://ex.org/a", "http://ex.org/knows", "http://ex.org/b"),
        ("_:b1", "http://ex.org/knows", "http://ex.org/a"),
        ("http://ex.org/b", "http://ex.org/knows", "_:b1"),
    ]
    assert lt.line_numbers == [2, 3, 7]
    assert lt.literals_dropped == 3


def test_ntriples_keep_literals() -> None:
    lt = parse(NT, fmt="ntriples", literals="keep")
    assert lt.literals_dropped == 0
    assert lt.tails == [
        "http://ex.org/b",
        "http://ex.org/a",
        '"Alice \\"A\\" Smith"@en',
        '"42"^^<http://www.w3.org/2001/XMLSchema#integer>',
        "_:b1",
        '"Bob"',
    ]


def test_ntriples_crlf_and_gzip(tmp_path: Path) -> None:
    path = tmp_path / "g.nt.gz"
    path.write_bytes(gzip.compress(NT.replace(b"\n", b"\r\n")))
    url = str(path)
    lt = parse_triples(
        read_bytes(url),
        source=url,
        fmt=detect_format(url, "auto"),
        delimiter=None,
        header=False,
        columns=None,
        literals="keep",
    )
    assert len(lt) == 6


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (b"<http://a> <http://p> <http://b>", "missing final '.'"),
        (b"<http://a> <http://p> <http://b> # no dot", "missing final '.'"),
        (b'"lit" <http://p> <http://b> .', "the subject cannot be a literal"),
        (b"<http://a> _:p <http://b> .", "the predicate must be an IRI <...>"),
        (b'<http://a> <http://p> "unterminated .', "unterminated or malformed literal in object"),
        (b"<http://a> <http://p> <http://b> <http://c> .", "expected '.' after the object"),
        (b"<http://a b> <http://p> <http://c> .", "malformed IRI in subject"),
        (b"<http://a> <http://p> <http://b .", "unterminated IRI in object"),
        (b'<http://a> <http://p> "x"@ .', "malformed language tag or datatype in object"),
        (b"@prefix ex: <http://ex.org/> .", "this looks like Turtle"),
        (b"<http://a> <http://p> .", "the object must be an IRI"),
    ],
)
def test_ntriples_malformed(line: bytes, problem: str) -> None:
    err = data_error(b"<http://x> <http://p> <http://y> .\n" + line + b"\n", fmt="ntriples")
    assert err.line == 2
    assert err.excerpt == line.decode()
    assert err.problem.startswith("malformed N-Triples statement: " + problem)
    assert str(err).startswith("g.tsv, line 2: malformed N-Triples statement: ")


def test_ntriples_one_term_is_one_label_however_it_is_escaped() -> None:
    """Escapes were kept as written: <Caf\\u00E9> and <Café> were two entities (N-Triples
    1.0 tools escape all non-ASCII), "a"@EN and "a"@en two literals."""
    nt = r"""<http://ex.org/Caf\u00E9> <http://ex.org/p> <http://ex.org/b> .
<http://ex.org/Caf\U000000e9> <http://ex.org/p> "caf\u00e9"@EN .
<http://ex.org/Café> <http://ex.org/p> "café"@en .
<http://ex.org/b> <http://ex.org/p> "say \"hi\"\n\u0041\t" .
<http://ex.org/b> <http://ex.org/p> "x"^^<http://www.w3.org/2001/XMLSchema#string> .
<http://ex.org/b> <http://ex.org/p> "x" .
<http://ex.org/\uD83D\uDE00> <http://ex.org/p> <http://ex.org/\U0001F600> .
""".encode()
    lt = parse(nt, fmt="ntriples", literals="keep")
    assert set(lt.heads) == {"http://ex.org/Café", "http://ex.org/b", "http://ex.org/😀"}
    assert lt.tails == ["http://ex.org/b", '"café"@en', '"café"@en', '"say \\"hi\\"\\nA\t"',
                        '"x"', '"x"', "http://ex.org/😀"]  # fmt: skip
    assert lt.heads[-1] == "http://ex.org/😀"  # a UTF-16 pair, escaped half by half


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (rb'<http://a> <http://p> "x\q" .', "invalid escape '\\\\q'"),
        (rb"<http://a\u0020b> <http://p> <http://c> .", "an escape in an IRI stands for"),
        (b"<> <http://p> <http://c> .", "an empty IRI <>"),
        (rb"<http://a\uD83D> <http://p> <http://c> .", "an escape of half a UTF-16 pair"),
    ],
)
def test_ntriples_bad_escapes_and_empty_iris_are_refused(line: bytes, problem: str) -> None:
    err = data_error(b"<http://x> <http://p> <http://y> .\n" + line + b"\n", fmt="ntriples")
    assert err.line == 2 and problem in err.problem, err.problem


def test_ntriples_all_literals_dropped_is_not_empty_file() -> None:
    lt = parse(b'<http://a> <http://p> "x" .\n', fmt="ntriples")
    assert len(lt) == 0
    assert lt.literals_dropped == 1


# ---------------------------------------------------------------------------------------------
# performance


def test_fb15k237_train_parses_fast() -> None:
    import time

    path = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "fb15k-237" / "train.txt"
    if not path.exists():
        pytest.skip(f"{path} not available")
    data = path.read_bytes()
    start = time.perf_counter()
    lt = parse_triples(
        data,
        source=str(path),
        fmt="tsv",
        delimiter=None,
        header=False,
        columns=None,
        literals="drop",
    )
    elapsed = time.perf_counter() - start
    assert len(lt) == 272_115
    assert lt.heads[0] == "/m/027rn"
    assert lt.tails[0] == "/m/06cx9"  # the CR of the CRLF line ending is not part of the label
    assert elapsed < 2.0, f"parsing FB15k-237 train took {elapsed:.2f} s"
