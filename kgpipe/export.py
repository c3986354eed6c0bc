"""Model files and embedding exports.

``model.safetensors`` holds the two tables (``entity``, ``relation``) and, in its metadata, the
:class:`~kgpipe.models.spec.ModelSpec` -- no pickle anywhere.

Exports (``parquet`` or ``npy``) are self-describing: see ``docs/embeddings.md`` for the layouts
and scoring functions; the same text is stored in the Parquet schema metadata under ``kgpipe``.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file as st_save_file

from kgpipe.data.vocab import Vocabulary, escape_label
from kgpipe.errors import RunError
from kgpipe.models.interactions import INTERACTIONS
from kgpipe.models.model import KGEModel
from kgpipe.models.spec import ModelSpec
from kgpipe.storage import RetryPolicy, Store

__all__ = [
    "ENTITY_PARTS",
    "NO_MODEL",
    "clear_export",
    "export_embeddings",
    "load_model",
    "model_info",
    "relation_labels",
    "save_model",
    "table_parquet",
]

MODEL_FILE = "model.safetensors"
#: what a run without its model file says (training was stopped, or is still going)
NO_MODEL = (
    "no model file: the run has not finished (go on with kgpipe train ... --resume; evaluate, "
    "export, predict and neighbours read a committed checkpoint with --checkpoint latest)"
)


def save_model(model: KGEModel, store: Store, rel: str = MODEL_FILE) -> None:
    """Write the tables and spec as safetensors (no pickle)."""
    tensors = {
        "entity": model.entity.data.cpu().contiguous(),
        "relation": model.relation.data.cpu().contiguous(),
    }
    metadata = {"kgpipe_model": model.spec.to_json()}
    store.write_produced(  # streamed to a file: no copy of the tables in memory
        rel,
        lambda path: st_save_file(tensors, path, metadata=metadata),
        size=sum(t.numel() * t.element_size() for t in tensors.values()),
        checksum=False,  # nothing keeps it: a model file is not a checkpoint
    )


def load_model(store: Store, rel: str = MODEL_FILE) -> KGEModel:
    """Read a model written by :func:`save_model`."""
    if not store.exists(rel):
        raise RunError(f"{store.url_of(rel)}: {NO_MODEL}")
    with store.local_copy(rel) as path:  # read straight into the tables: no copy in bytes
        try:
            with safe_open(path, framework="pt") as f:
                meta = f.metadata() or {}
                if "kgpipe_model" not in meta:
                    raise RunError(f"{store.url_of(rel)}: not a kgpipe model file")
                tensors = {k: f.get_tensor(k).float() for k in ("entity", "relation")}
            spec = ModelSpec.from_json(meta["kgpipe_model"])
        except (SafetensorError, ValueError, TypeError, KeyError) as err:
            raise RunError(f"{store.url_of(rel)}: not a readable model file ({err})") from None
    try:  # checks the shapes: copying into the spec's tables broadcast a (1, dim) table
        return KGEModel(spec, tables=(tensors["entity"], tensors["relation"]))
    except ValueError as err:
        where = store.url_of(rel)
        raise RunError(f"{where}: its tables do not fit its model spec ({err})") from None


# every file an export may hold: an export replaces all of them, so that one written earlier in
# another layout, format or number of parts is not read with the new one
EXPORT_FILES = (
    "entities.parquet",
    "relations.parquet",
    "entities.npy",
    "entities.tsv",
    "relations.npy",
    "relations.tsv",
)
ENTITY_PARTS = "entities"  # a sharded export's entity parts (:mod:`kgpipe.export_shards`)


def clear_export(store: Store) -> None:
    """Remove an earlier export under ``store`` (``model.json`` first, so a reader never
    sees it with files of another export). Only where a kgpipe ``model.json`` says there is
    one, and only an export's own files: a folder of the user's keeps whatever else it holds."""
    try:  # a kgpipe export's model.json (model_info): else not ours to clear
        info = json.loads(store.read_text("model.json")) if store.exists("model.json") else {}
    except (ValueError, UnicodeDecodeError):
        info = {}
    if not (isinstance(info, dict) and {"model", "scoring"} <= info.keys()):
        return
    for name in ("model.json", *EXPORT_FILES):
        store.remove(name, recursive=False)
    for name in store.list(ENTITY_PARTS):
        if re.fullmatch(r"part-\d+\.parquet", name):
            store.remove(f"{ENTITY_PARTS}/{name}", recursive=False)
    store.remove_empty_folders([ENTITY_PARTS])


def relation_labels(vocab: Vocabulary, spec: ModelSpec) -> list[str]:
    """Labels of the relation table's rows; inverse rows (reciprocal models) end in ``^-1``."""
    labels = list(vocab.relations)
    if spec.reciprocal:
        labels += [f"{x}^-1" for x in vocab.relations]
    return labels


_LIST_VALUES_MAX = 2**31 - 1  # the most values one chunk of a list<float> column addresses


def table_parquet(
    ids: np.ndarray,
    labels: list[str],
    emb: np.ndarray,
    meta: dict[str, str],
    *,
    inverse: int | None = None,
) -> bytes:
    """One embedding table as Parquet. A relation table (``inverse``: its number of relations)
    adds a boolean column ``inverse`` that says which rows are inverse relations: a label does
    not (a graph may hold both ``x`` and ``x^-1``)."""
    dim = max(int(emb.shape[1]), 1)
    values = emb.astype(np.float32, copy=False)
    # a list column's offsets are int32: a table of 2**31 floats or more is written in chunks
    # (one column, the same type and file layout) instead of wrapping them to negative values
    rows = max(1, (_LIST_VALUES_MAX // dim))
    chunks = [
        pa.ListArray.from_arrays(
            pa.array(np.arange(0, (len(part) + 1) * dim, dim, dtype=np.int32)),
            pa.array(part.reshape(-1), type=pa.float32()),
        )
        for part in (values[lo : lo + rows] for lo in range(0, max(len(values), 1), rows))
    ]
    table = pa.table(
        {
            "id": pa.array(ids, type=pa.int64()),
            "label": pa.array(labels, type=pa.string()),
            "embedding": pa.chunked_array(chunks, type=pa.list_(pa.float32())),
        }
    )
    if inverse is not None:
        table = table.append_column("inverse", pa.array(np.asarray(ids) >= inverse))
    table = table.replace_schema_metadata(meta)
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def model_info(spec: ModelSpec) -> dict[str, Any]:
    """What ``model.json`` (and the Parquet metadata) says of an export's model."""
    return {
        "model": json.loads(spec.to_json()),
        "scoring": INTERACTIONS.get(spec.name).scoring,
        "relation_rows": "rows num_relations.. are inverse relations" if spec.reciprocal else "",
    }


def export_embeddings(
    model: KGEModel,
    vocab: Vocabulary,
    out_url: str,
    *,
    fmt: str = "parquet",
    storage_options: dict[str, Any] | None = None,
    retry: RetryPolicy | None = None,
) -> list[str]:
    """Write entity and relation embeddings under ``out_url``; returns the URLs written.

    ``parquet``: ``entities.parquet``/``relations.parquet`` with columns ``id``, ``label``,
    ``embedding`` (list<float32>). ``npy``: ``entities.npy``/``relations.npy`` (float32 matrices,
    row = id) with ``entities.tsv``/``relations.tsv`` (``id<TAB>label``). Both also write
    ``model.json`` (spec, layout and scoring function).
    """
    spec = model.spec
    if fmt not in ("parquet", "npy"):
        raise ValueError(f"unknown export format {fmt!r}; known: npy, parquet")
    store = Store(out_url, storage_options, retry=retry)
    clear_export(store)
    info = model_info(spec)
    meta = {"kgpipe": json.dumps(info)}
    ent = model.entity.data.cpu().numpy()
    rel = model.relation.data.cpu().numpy()
    rel_labels = relation_labels(vocab, spec)
    written = []
    if fmt == "parquet":
        for name, emb, labels, inverse in (
            ("entities", ent, list(vocab.entities), None),
            ("relations", rel, rel_labels, len(vocab.relations)),
        ):
            ids = np.arange(emb.shape[0])
            store.write_bytes(
                f"{name}.parquet", table_parquet(ids, labels, emb, meta, inverse=inverse)
            )
            written.append(store.url_of(f"{name}.parquet"))
    else:  # npy
        for name, emb, labels in (
            ("entities", ent, list(vocab.entities)),
            ("relations", rel, rel_labels),
        ):
            buf = io.BytesIO()
            np.save(buf, emb.astype(np.float32), allow_pickle=False)
            store.write_bytes(f"{name}.npy", buf.getvalue())
            tsv = "".join(f"{i}\t{escape_label(lab)}\n" for i, lab in enumerate(labels))
            store.write_text(f"{name}.tsv", tsv)
            written += [store.url_of(f"{name}.npy"), store.url_of(f"{name}.tsv")]
    store.write_json("model.json", info)
    written.append(store.url_of("model.json"))
    return written
