"""The columnar reader of tab-separated files gives exactly what the line parser gives: the same
ids, reports and fingerprint, or the same error with the same line (kgpipe.data.columnar)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest
import torch

import kgpipe.data.reading as reading
from kgpipe.config import DataConfig
from kgpipe.data.dataset import TripleDataset, load_dataset
from kgpipe.errors import DataError

GRAPH = "a\tr1\tb\nb\tr2\tc\nc\tr1\ta\na\tr2\tc\n"


def _load(cfg: DataConfig, columnar: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    seen: list[str] = []
    real = reading._read_columnar

    def spy(*args: Any) -> Any:
        out = real(*args)
        seen.append(out.reader)
        return out

    with monkeypatch.context() as m:
        m.setattr(reading, "_read_columnar", spy)
        if not columnar:
            m.setattr(reading, "_columnar_ok", lambda src, cfg: False)
        try:
            return load_dataset(cfg), seen
        except DataError as err:
            return str(err), seen


def _same(a: TripleDataset, b: TripleDataset) -> None:
    for k in ("train", "valid", "test"):
        assert torch.equal(getattr(a, k), getattr(b, k)), k
    assert a.vocab == b.vocab
    assert a.reports == b.reports
    assert a.fingerprint == b.fingerprint


def _both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str | bytes], **cfg: Any
) -> tuple[Any, list[str]]:
    urls = {}
    every = cfg.pop("compression", None)  # every file: "zstd"
    ext = cfg.pop("ext", "tsv")
    for split, text in files.items():
        data = text.encode() if isinstance(text, str) else text
        name = f"{split}.{ext}.gz" if cfg.pop(f"{split}_gz", False) else f"{split}.{ext}"
        if every == "zstd":
            import zstandard

            name, data = f"{split}.{ext}.zst", zstandard.ZstdCompressor().compress(data)
        path = tmp_path / name
        path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
        urls[split] = str(path)
    return compare(DataConfig(**urls, **cfg), monkeypatch)


def compare(config: DataConfig, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[str]]:
    """``config`` read by the columnar reader where it applies and by the line parser: the same
    data set or the same error; the first, and the readers the first used."""
    fast, seen = _load(config, True, monkeypatch)
    slow, _ = _load(config, False, monkeypatch)
    if isinstance(slow, str):
        assert fast == slow
    else:
        assert not isinstance(fast, str), fast
        _same(fast, slow)
    return fast, seen


CASES: dict[str, dict[str, str | bytes]] = {
    "plain": {"train": GRAPH},
    "comments, blank and whitespace lines": {
        "train": "# a comment\n\n" + GRAPH + "   \n#x\ty\tz\n\t \n# c\td\n"
    },
    "crlf and a bom": {"train": "\ufeff" + GRAPH.replace("\n", "\r\n")},
    "no final newline": {"train": GRAPH.rstrip("\n")},
    "duplicates": {"train": GRAPH + GRAPH + "a\tr1\tb\n"},
    "unicode order": {"train": "é\tr\tz\nZ\tr\tä\n😀\tr\ta\nb\tr\tÉ\nz\tr\tA\n"},
    "spaces inside labels": {"train": "New York\tlocated in\tUnited States\nx y\tr\t z\n"},
    "valid and test, unseen kept": {
        "train": GRAPH,
        "valid": "a\tr1\tc\nd\tr1\ta\n",
        "test": "a\tr3\tb\nc\tr2\te\n",
    },
    "header by its names": {"train": "head\trelation\ttail\n" + GRAPH},
    "header occurring nowhere else": {
        "train": "src\trel\tdst\n" + GRAPH * 2 + "d\tr1\te\ne\tr2\tf\nf\tr1\td\n",
        "valid": "from\tlabel\tto\na\tr1\tc\nb\tr2\ta\nc\tr1\tb\n",
    },
    "a first row that is data": {"train": "x\ty\tz\n" + GRAPH},
    "wrong field count": {"train": GRAPH + "a\tr1\n" + "b\t\tc\n"},
    "empty label": {"train": GRAPH + "a\t\tc\n"},
    "blank label": {"train": GRAPH + "a\t \tc\n"},
    "invalid utf-8 after a field error": {"train": (GRAPH + "a\tb\n").encode() + b"x\xff\tr\ty\n"},
    "four fields": {"train": GRAPH + "a\tb\tc\td\n"},
    "only a header": {"train": "head\trelation\ttail\n"},
    "a header of four fields": {"train": "# names\nhead\trelation\ttail\tweight\n" + GRAPH},
    "a header with a blank name": {"train": "head\t\ttail\n" + GRAPH},
    "empty train": {"train": "# nothing\n"},
    "empty valid": {"train": GRAPH, "valid": "# nothing\n   \n"},
    "a lone carriage return": {"train": "a\tr\tb\rc\ts\td\n" + GRAPH},
    "a comment ended by a lone carriage return": {"train": "# note\rx\ty\tz\n" + GRAPH},
    "a carriage return before crlf": {"train": "a\tr\tb\r\r\n" + GRAPH},
    "cr cr lf throughout": {"train": GRAPH.replace("\n", "\r\r\n")},
    "mac line endings": {"train": GRAPH.replace("\n", "\r")},
    "a header whose relation is an entity": {"train": "x\ty\tz\na\tr\tb\ny\tr\tc\n"},
    "invalid utf-8 in a comment": {"train": GRAPH.encode() + b"#\xff\n"},
}


#: cases the columnar reader hands to the line parser (pyarrow ends a row at a lone CR)
FALLS_BACK = {
    "a lone carriage return",
    "a comment ended by a lone carriage return",
    "a carriage return before crlf",
    "mac line endings",
}


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_columnar_equals_line_parser(
    case: str, compression: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every case, plain and Zstandard-compressed (which the line parser read whole, holding
    the file and a string per field: ~250 bytes a line, until session 54)."""
    out, seen = _both(tmp_path, monkeypatch, CASES[case], compression=compression)
    if not isinstance(out, str):  # a graph read: by the columnar reader unless it fell back
        assert seen == ([] if case in FALLS_BACK else ["columnar"])


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
@pytest.mark.parametrize("unseen", ["keep", "drop", "error"])
def test_unseen_and_its_line(
    unseen: str, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"train": GRAPH, "test": "# c\na\tr1\tc\n\nc\tr2\tq\nq\tr9\ta\n"}
    if fmt == "csv":
        files = {k: v.replace("\t", ",") for k, v in files.items()}
    out, seen = _both(tmp_path, monkeypatch, files, unseen=unseen, ext=fmt)
    assert seen == ["columnar"]
    if unseen == "error":
        assert "line 4" in out and "'q'" in out


def test_options_gzip_delimiter_and_small_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [f"e{i % 997};r{i % 13};e{(i * 7) % 1009}" for i in range(40_000)]
    text = "\n".join(rows) + "\n"
    out, seen = _both(
        tmp_path,
        monkeypatch,
        {"train": text, "valid": "e1;r1;e2\n"},
        train_gz=True,
        delimiter=";",
        block_size="64KiB",
        header=False,
    )
    assert seen == ["columnar"]  # several blocks, one gzip stream
    assert out.train.shape[0] == len(set(rows))


def _as_csv(text: str | bytes) -> str | bytes:
    return text.replace("\t", ",") if isinstance(text, str) else text.replace(b"\t", b",")


#: CSV files that quote, which the columnar reader reads where pyarrow reads them as the
#: ``csv`` module does (a record a line)
QUOTED: dict[str, str] = {
    "quoted fields": '"New York, NY",r1,"b"\n',
    "a quote inside a field": 'a"b,r1,c\n',
    "a quoted header": '"head","relation","tail"\n',
    "doubled quotes": '"say ""hi""",r1,"b"""\n',
    "a quoted tab": '"a\tb",r1,c\n',
    "a quote after a space": ' "a",r1,c\n',
    "a row of empty quoted fields": '"","",""\n',
    "a quoted record of two empty fields": '"",""\n',
    "an empty quoted field": 'a,"",c\n',
    "a bom before a quoted field": '\ufeff"a,b",r1,c\n',
    "a quoted field last, crlf": 'a,r1,"c, d"\r\n',
}
#: ... and that the line parser reads (the csv module refuses text after a closing quote,
#: pyarrow reads on; the columnar reader takes a `#` at a row's start as a comment)
QUOTED_LINE_PARSER: dict[str, str] = {
    "a quoted head that starts with a hash": '"#x",r1,b\n',
    "a quoted field over two lines": 'a,"r\n1",b\n',
    "text after a closing quote": '"a"b,r1,c\n',
    "a space after a closing quote": 'a,"r1" ,c\n',
    "a bom before text after a closing quote": '\ufeff"a"b,r1,c\n',
    "a comment that quotes": '#x,"a,b",c\n',
    "an unterminated quote": 'a,r1,"c\n',
}
#: CSV files the columnar reader hands to the line parser: the ``csv`` module reads those
#: quotes, NUL bytes and fields over its limit otherwise than pyarrow
CSV_CASES: dict[str, dict[str, str | bytes]] = {
    **{k: {"train": v + _as_csv(GRAPH)} for k, v in {**QUOTED, **QUOTED_LINE_PARSER}.items()},  # type: ignore[operator]
    **{
        f"{k}, last": {"train": _as_csv(GRAPH) + v}
        for k, v in QUOTED_LINE_PARSER.items()
        if "bom" not in k
    },  # type: ignore[operator]
    "a quoted field over two lines": {"train": 'a,"r\n1",b\n' + _as_csv(GRAPH)},  # type: ignore[operator]
    "a nul byte": {"train": "a\0,r1,b\n" + _as_csv(GRAPH)},  # type: ignore[operator]
    "a field over the csv limit": {"train": "x" * 131_073 + ",r1,b\n" + _as_csv(GRAPH)},  # type: ignore[operator]
    # the csv module's limit comes first on its line, and holds for blank lines (not comments)
    "over the limit on a line of four fields": {
        "train": _as_csv(GRAPH) + "x" * 131_073 + ",a,b,c\n"
    },  # type: ignore[operator]
    "over the limit before a wrong field count": {
        "train": _as_csv(GRAPH) + "x" * 131_073 + ",r1,b\na,b,c,d\n"  # type: ignore[operator]
    },
    "over the limit before an empty label": {
        "train": _as_csv(GRAPH) + "x" * 131_073 + ",r1,b\na,,c\n"  # type: ignore[operator]
    },
    "a blank line over the limit": {"train": _as_csv(GRAPH) + " " * 131_073 + "\n"},  # type: ignore[operator]
    "blank fields over the limit": {"train": _as_csv(GRAPH) + " " * 131_073 + ", , \n"},  # type: ignore[operator]
    "a comment over the limit": {"train": _as_csv(GRAPH) + "#" + "x" * 131_073 + "\n"},  # type: ignore[operator]
}


@pytest.mark.parametrize(
    "case,fmt,header",
    [(c, "tsv", True) for c in sorted(CASES)]  # "auto": test_columnar_equals_line_parser
    + [(c, "csv", h) for c in sorted(CASES) + sorted(CSV_CASES) for h in ("auto", True)],
)
def test_csv_files_and_header_rows_equal_the_line_parser(
    case: str, fmt: str, header: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CSV files and ``data.header: true`` went to the line parser, which holds the whole file
    and a Python string per field. A CSV file now takes the columnar reader (one that quotes
    since session 57, where each line that quotes is a record pyarrow reads as the csv module
    does), and so does a file with a header row, each with the line parser's results and
    errors."""
    files = CASES.get(case) or CSV_CASES[case]
    if fmt == "csv":
        files = {k: _as_csv(v) for k, v in files.items()}
    out, seen = _both(tmp_path, monkeypatch, files, ext=fmt, header=header)
    if not isinstance(out, str):
        # the csv module reads a CR before CR LF as part of the line end: not a label's; a blank
        # field stops the columnar reader before it knows the row is the header
        falls_back = (
            FALLS_BACK
            | (set(CSV_CASES) - set(QUOTED))
            | ({"cr cr lf throughout"} if fmt == "csv" else set())
        )
        falls_back |= (
            {"a header with a blank name", "an empty quoted field"} if header is True else set()
        )
        falls_back -= {"a comment over the limit"}  # not read as CSV: no limit
        assert seen == ([] if case in falls_back else ["columnar"])


def _quoted_csv(seed: int, rows: int = 4_000) -> list[str]:
    """Random CSV records a line each, quoting as spreadsheets and R write them, and more."""
    import random

    rng = random.Random(seed)

    def field(n: int) -> str:
        return rng.choice(
            [f"e{n}", f'"e{n}"', f'"e, {n}"', f'"say ""{n}"""', f'e"{n}', f' "e{n}"', f'"e\t{n}"']
        )

    out = []
    for n in range(rows):
        r = rng.random()
        if r < 0.01:
            out.append(rng.choice(["# a note\n", "\n", '"","",""\n', "#a,b,c\n"]))
        end = "\r\n" if seed % 2 and r < 0.5 else "\n"
        out.append(f"{field(n % 300)},{field(n % 7)},{field((n * 7) % 300)}{end}")
    return out


@pytest.mark.parametrize("seed", range(4))
def test_random_quoted_csv_files_equal_the_line_parser(
    seed: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CSV file that quoted went to the line parser whole; over 64-KiB blocks of records
    that quote in every way the csv module reads on one line, the columnar reader gives its
    data set; a record it would read otherwise, in a later block, gives its error."""
    lines = _quoted_csv(seed)
    out, seen = _both(
        tmp_path, monkeypatch, {"train": "".join(lines)}, ext="csv", block_size="64KiB"
    )
    assert seen == ["columnar"] and not isinstance(out, str), out
    bad = 3_000 + seed  # refused by both; read by the line parser (two lines, a `#` head)
    lines.insert(bad, ['"a"b,r,c\n', 'a,"r\n1",c\n', '"#a",r,c\n', "a,b\n"][seed])
    out, seen = _both(
        tmp_path, monkeypatch, {"train": "".join(lines)}, ext="csv", block_size="64KiB"
    )
    if seed in (0, 3):
        assert isinstance(out, str) and f"line {bad + 1}:" in out, out
    else:
        assert seen == [] and not isinstance(out, str), out


def test_quoted_csv_names_the_line_and_labels_of_an_unseen_entity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line of a triple was found by splitting lines at commas: a quoted label was cut
    (and a row of empty quoted fields, skipped, was counted)."""
    test = 'c,r1,"a, b"\n"","",""\n"""q""",r1,c\n'
    files = {"train": '"a, b",r1,c\nc,r1,"a, b"\n', "test": test}
    out, seen = _both(tmp_path, monkeypatch, files, ext="csv", unseen="error")
    assert seen == ["columnar"] and "line 3" in out and '"q"\\tr1\\tc' in out, out


R_CSV = '"","head","relation","tail"\n"1","a","r1","b"\n"2","b","r2","c"\n"3","c","r1","a"\n'


@pytest.mark.parametrize("columns", [("head", "relation", "tail"), (1, 2, 3)])
def test_r_write_csv_files_with_data_columns_take_the_columnar_reader(
    columns: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R's write.csv quotes the header too, and names its row numbers "": the first row was
    split at commas, so any quote in it sent the file to the line parser."""
    out, seen = _both(
        tmp_path, monkeypatch, {"train": R_CSV}, ext="csv", header=True, columns=columns
    )
    assert seen == ["columnar"] and not isinstance(out, str), out


@pytest.mark.parametrize(
    "bad", ['"a","b"\n', '"a","r1",""\n', "x" * 131_073 + ',"r1",b\n', '"a","r1","b",""\n']
)
def test_an_error_in_a_quoted_csv_is_found_without_the_line_parser(
    bad: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line scan that names a columnar file's error gave up at the first quote, and the
    line parser read the whole file to say it: a file too large for it had no error."""
    rows = '"a","r1","b"\n"b","r2","c"\n"c, d","r1","a"\n'
    files = {"train": rows * 50 + bad + '"a","r1","c"\n'}
    out, _ = _both(tmp_path, monkeypatch, files, ext="csv")
    assert isinstance(out, str) and "line 151" in out, out

    def no(*args: Any) -> Any:
        raise AssertionError("the line parser read the file")

    monkeypatch.setattr(reading, "read_lines", no)
    again, _ = _load(DataConfig(train=str(tmp_path / "train.csv")), True, monkeypatch)
    assert again == out


def test_a_blank_quoted_record_of_other_fields_is_skipped_by_the_columnar_reader(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"train": '"a","r1","b"\n"",""\n" ",""," "\n"b","r1","c"\n'}
    out, seen = _both(tmp_path, monkeypatch, files, ext="csv")
    assert seen == ["columnar"] and not isinstance(out, str), out


WIDE = "id\th\tw\tr\tt\n1\ta\t.5\tr1\tb\n2\tb\t\tr2\tc\n3\tc\t1\tr1\ta\n4\ta\t2\tr2\tc\n"
NAMES = ("h", "r", "t")

#: data.columns: (files, columns, header); every one also as CSV
COLUMN_CASES: dict[str, tuple[dict[str, str | bytes], Any, Any]] = {
    "by name": ({"train": WIDE}, NAMES, "auto"),
    "by name, header true": ({"train": "# a note\n\n" + WIDE}, NAMES, True),
    "reordered": ({"train": WIDE}, ("t", "r", "h"), True),
    "one column twice": ({"train": WIDE}, ("h", "r", "h"), True),
    "by index, no header row": ({"train": WIDE.split("\n", 1)[1]}, (1, 3, 4), False),
    "by index, a header row found": ({"train": WIDE}, (1, 3, 4), "auto"),
    "by index as text": ({"train": WIDE.split("\n", 1)[1]}, ("1", "3", "4"), False),
    "valid and test": (
        {"train": WIDE, "valid": "id\th\tw\tr\tt\n9\ta\t\tr1\tc\n", "test": WIDE},
        NAMES,
        True,
    ),
    "a row with more fields": ({"train": WIDE + "5\tb\t3\tr1\ta\textra\n"}, NAMES, True),
    "a row with too few fields": ({"train": WIDE + "5\tb\t3\tr1\n"}, NAMES, True),
    "a blank picked field": ({"train": WIDE + "5\t \t3\tr1\ta\n"}, NAMES, True),
    "a row of blank fields": ({"train": WIDE + "\t\t \t\t\n"}, NAMES, True),
    "comments of three fields": ({"train": WIDE + "#x\ty\tz\n#a\tb\tc\td\te\n"}, NAMES, True),
    "a name not in the header": ({"train": WIDE}, ("h", "rel", "t"), True),
    "a name twice in the header": ({"train": WIDE.replace("\tw\t", "\th\t", 1)}, NAMES, True),
    "names without a header row": ({"train": WIDE}, NAMES, False),
    "invalid utf-8 after a wrong name": (
        {"train": WIDE.encode() + b"\xff\n"},
        ("x", "r", "t"),
        True,
    ),
    "an index past the fields": ({"train": WIDE}, (1, 3, 7), True),
    "only a header": ({"train": "id\th\tw\tr\tt\n"}, NAMES, True),
    "only comments": ({"train": "# nothing\n"}, NAMES, True),
}


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
@pytest.mark.parametrize("case", sorted(COLUMN_CASES))
def test_data_columns_equal_the_line_parser(
    case: str, fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``data.columns`` (three of a file's fields, by name or index) sent a text file to the
    line parser, whole. The columnar reader now picks them from rows of the first row's
    fields; a file whose rows vary goes to the line parser, which takes rows of more fields."""
    files, columns, header = COLUMN_CASES[case]
    if fmt == "csv":
        files = {k: _as_csv(v) for k, v in files.items()}
    out, seen = _both(tmp_path, monkeypatch, files, ext=fmt, header=header, columns=columns)
    if not isinstance(out, str):
        line_parser = case in ("a row with more fields", "only comments")
        assert seen == ([] if line_parser else ["columnar"]), out


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
def test_data_columns_name_the_line_of_an_unseen_entity(
    fmt: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = {"train": WIDE, "test": "id\th\tw\tr\tt\n8\ta\t\tr1\tc\n9\tq\t\tr1\ta\n"}
    if fmt == "csv":
        files = {k: v.replace("\t", ",") for k, v in files.items()}
    out, seen = _both(
        tmp_path, monkeypatch, files, ext=fmt, header=True, columns=NAMES, unseen="error"
    )
    assert seen == ["columnar"] and "line 3" in out and "q\\tr1\\ta" in out, out


def test_cr_cr_lf_line_ends_are_refused_not_read_as_other_labels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lines ending CR CR LF (a CRLF file written again in text mode on Windows) kept a CR on
    every tail: `c` as a head and `c\\r` as a tail were two entities, silently."""
    out, _ = _both(tmp_path, monkeypatch, CASES["cr cr lf throughout"])
    assert isinstance(out, str) and "line 1: a carriage return in the tail field" in out, out


def test_a_line_longer_than_a_block_is_read_in_larger_blocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a memory budget of 16 MiB the blocks are 1 MiB; a 2-MiB label sent every split to
    the line parser, which holds whole files (the budget abandoned, with a warning). The
    columnar reader now reads such a file again in blocks that hold its longest line."""
    long = "x" * (2 << 20)
    files = {"train": GRAPH + f"{long}\tr1\ta\n", "valid": f"a\tr1\t{long}\n"}
    out, seen = _both(tmp_path, monkeypatch, files, memory_budget="16MiB")
    assert seen == ["columnar"]
    assert long in out.vocab.entities


def test_comment_lines_of_three_fields_are_counted_in_a_warning_by_both_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A head that starts with '#' (a hashtag) makes its line a comment: two of three triples
    were gone without a word."""
    text = "#python\tr\t#java\n#java\tr\t#rust\n# a note\n#\t\t\nrust\tr\t#python\n" + GRAPH
    with caplog.at_level("WARNING", logger="kgpipe.data"):
        out, seen = _both(tmp_path, monkeypatch, {"train": text})
    assert seen == ["columnar"] and out.train.shape[0] == 5
    said = [r.getMessage() for r in caplog.records if "skipped as comments" in r.getMessage()]
    assert len(said) == 2 and all("2 lines starting with '#' hold three fields" in m for m in said)


def test_bad_block_size() -> None:
    with pytest.raises(ValueError, match="block_size"):
        DataConfig(train="x.tsv", block_size="1KiB")


def test_blocks_under_a_budget_are_a_256th_of_it() -> None:
    """pyarrow's reader holds dozens of blocks in flight: under a budget a block is at most
    1/256 of it, not below 1 MiB, and never above ``block_size``."""

    def block(**kw: str) -> int:
        return DataConfig(train="x.tsv", **kw).read_block_bytes

    mib = 1 << 20
    assert block() == 8 * mib  # no budget: block_size (default 8 MiB)
    assert block(block_size="64MiB") == 64 * mib
    assert block(memory_budget="256MiB") == 1 * mib
    assert block(memory_budget="512MiB") == 2 * mib
    assert block(memory_budget="64MiB") == 1 * mib  # the floor
    assert block(memory_budget="1GiB", block_size="1MiB") == 1 * mib  # block_size caps it
    assert block(memory_budget="8GiB") == 8 * mib  # 1/256 is 32 MiB: block_size caps it


@pytest.mark.slow
def test_a_script_that_stages_and_exits_exits_cleanly(tmp_path: Path) -> None:
    """pyarrow's CSV reader dropped its Python input on one of its threads, which must take the
    GIL to do so: at interpreter exit it could not, and about one script in ten that staged a
    graph and exited was aborted ("terminate called without an active exception", exit 134)."""
    import subprocess
    import sys

    (tmp_path / "train.csv").write_text("a,r,b\nb,r,c\nc,r,a\n")
    script = (
        "from kgpipe.config import DataConfig\n"
        "from kgpipe.data.dataset import load_dataset\n"
        "print(len(load_dataset(DataConfig(train='train.csv')).train))\n"
    )
    codes = []
    for _ in range(12):  # two at a time: ~1 s each
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script],
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for _ in range(2)
        ]
        codes += [(p.wait(), p.stderr.read().decode()[-300:]) for p in procs]  # type: ignore[union-attr]
    assert all(code == 0 for code, _ in codes), [c for c in codes if c[0]]


def test_a_lower_csv_field_limit_holds_as_the_line_parser_reads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limit was read once, at import: after ``csv.field_size_limit(10)`` the columnar
    reader took a 20-character label the line parser refused."""
    import csv

    previous = csv.field_size_limit(10)
    try:
        out, _ = _both(
            tmp_path, monkeypatch, {"train": _as_csv(GRAPH) + "x" * 20 + ",r1,a\n"}, ext="csv"
        )  # type: ignore[operator]
    finally:
        csv.field_size_limit(previous)
    assert (
        isinstance(out, str) and "line 5: malformed CSV: field larger than field limit (10)" in out
    )


def test_a_nul_delimiter_is_read_by_the_line_parser(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow refuses NUL as a delimiter: "cannot read: Expecting an ASCII character"."""
    out, seen = _both(tmp_path, monkeypatch, {"train": GRAPH.replace("\t", "\0")}, delimiter="\0")
    assert not isinstance(out, str) and seen == [], out


def test_the_comment_warning_is_said_once_when_a_later_split_falls_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    files = {"train": "#x,y,z\n" + _as_csv(GRAPH), "valid": '"a",r1,"b\nc"\n'}  # type: ignore[operator]
    with caplog.at_level("WARNING", logger="kgpipe.data"):
        out, seen = _load(DataConfig(**_files(tmp_path, files, "csv")), True, monkeypatch)
    assert seen == [] and not isinstance(out, str)  # a field over lines: the line parser read both
    said = [r for r in caplog.records if "skipped as comments" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]


def _files(tmp_path: Path, files: dict[str, str | bytes], ext: str) -> dict[str, str]:
    urls = {}
    for split, text in files.items():
        path = tmp_path / f"{split}.{ext}"
        path.write_bytes(text.encode() if isinstance(text, str) else text)
        urls[split] = str(path)
    return urls


def test_comment_warnings_are_said_before_a_later_splits_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The columnar reader kept its warnings until every split was read: an error in valid
    lost train's, which the line parser says before it fails."""
    files = {"train": "#x\ty\tz\n" + GRAPH, "valid": ""}
    for columnar in (True, False):
        caplog.clear()
        with caplog.at_level("WARNING", logger="kgpipe.data"):
            out, _ = _load(DataConfig(**_files(tmp_path, files, "tsv")), columnar, monkeypatch)
        assert "valid.tsv: no triples found (empty file)" in out
        said = [r for r in caplog.records if "skipped as comments" in r.getMessage()]
        assert len(said) == 1, (columnar, said)


def test_comments_before_a_header_row_are_counted_by_both_readers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The line parser's tab-separated header search skipped them uncounted (its CSV parser and
    the columnar reader counted them)."""
    files = {"train": "#a\tb\tc\n\nh\tr\tt\n" + GRAPH}
    for columnar in (True, False):
        caplog.clear()
        with caplog.at_level("WARNING", logger="kgpipe.data"):
            _out, _ = _load(
                DataConfig(**_files(tmp_path, files, "tsv"), header=True), columnar, monkeypatch
            )
        said = [r for r in caplog.records if "skipped as comments" in r.getMessage()]
        assert len(said) == 1 and "1 line starting" in said[0].getMessage(), (columnar, said)


def test_a_csv_line_over_the_limit_before_the_header_is_the_first_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving data.columns came first: "tail column 'zz' not in the header" at line 2,
    where the csv module refuses line 1."""
    text = " " * 140_000 + "\nid,h,r,t\n1,a,r1,b\n2,b,r2,c\n"
    out, _ = _both(
        tmp_path, monkeypatch, {"train": text}, ext="csv", header=True, columns=("h", "r", "zz")
    )
    assert isinstance(out, str) and "line 1: malformed CSV: field larger than field limit" in out


def test_an_error_found_before_a_line_the_columnar_reader_leaves_is_still_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line scan gave up at a later quote that is no whole record, after it had the error."""
    files = {"train": 'a,r,b\na,r\n"a"b,r,c\n'}
    out, _ = _both(tmp_path, monkeypatch, files, ext="csv")
    monkeypatch.setattr(reading, "read_lines", lambda *a: pytest.fail("the line parser read it"))
    again, _ = _load(DataConfig(train=str(tmp_path / "train.csv")), True, monkeypatch)
    assert again == out and "line 2: expected 3" in out, out
