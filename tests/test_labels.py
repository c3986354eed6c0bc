"""Labels over an Arrow array read as the tuple of strings they replace."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow as pa
import pytest

from kgpipe.data import labels as labels_module
from kgpipe.data import vocab as vocab_module
from kgpipe.data.labels import Labels
from kgpipe.data.vocab import Vocabulary


def _labels(values: list[str]) -> Labels:
    return Labels(pa.array(values, pa.large_string()))


def test_labels_read_as_the_tuple(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(labels_module, "_CHUNK", 3)  # iterate across block boundaries
    values = [f"e{i}" for i in range(10)] + ["tab\there", "é"]
    got, want = _labels(values), tuple(values)
    assert len(got) == len(want)
    assert list(got) == list(want)
    assert got == want and want == got and got == _labels(values)
    assert got == Labels(pa.array(values, pa.string()))  # another string type, the same labels
    assert got != want[:-1] and got != (*want[:-1], "x")
    assert [got[i] for i in range(-len(want), len(want))] == [
        want[i] for i in range(-len(want), len(want))
    ]
    for s in (slice(2, 7), slice(None, 4), slice(-3, None), slice(1, 9, 3), slice(5, 2)):
        part = got[s]
        assert isinstance(part, Labels) and tuple(part) == want[s]
    with pytest.raises(IndexError):
        got[len(want)]
    with pytest.raises(IndexError):
        got[-len(want) - 1]
    assert "e3" in got and "e99" not in got
    assert got.index("e4") == 4
    assert hash(got) == hash(want)
    back = pickle.loads(pickle.dumps(got))
    assert isinstance(back, Labels) and back == got
    assert "12 labels" in repr(got)


def test_labels_refuse_nulls() -> None:
    with pytest.raises(ValueError, match="null"):
        Labels(pa.array(["a", None], pa.large_string()))


def test_a_vocabulary_of_labels_writes_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The written files are those of the same vocabulary as tuples, in blocks of lines."""
    monkeypatch.setattr(vocab_module, "_WRITE_BLOCK", 4)
    entities = ["b", "a\\b", "new\nline", "tab\t", "cr\r", "z"]
    arrow = Vocabulary(entities=_labels(entities), relations=("r1", "r2"))
    plain = Vocabulary(entities=tuple(entities), relations=["r1", "r2"])
    assert isinstance(arrow.entities, Labels) and isinstance(plain.relations, tuple)
    assert arrow == plain
    for name, vocab in (("arrow", arrow), ("plain", plain)):
        vocab.write(f"{tmp_path}/{name}")
    for file in ("entities.tsv", "relations.tsv"):
        assert (tmp_path / "arrow" / file).read_bytes() == (tmp_path / "plain" / file).read_bytes()
    back = Vocabulary.read(f"{tmp_path}/arrow")
    assert back == arrow and back.entity_id("new\nline") == 2
    assert arrow.entity_id("z") == 5 and arrow.find_entity("z") == 5
    assert arrow.entities[:2] == ("b", "a\\b")
