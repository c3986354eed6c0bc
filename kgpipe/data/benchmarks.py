"""The standard link-prediction benchmarks: where to find them and their published checksums.

``umls`` is small enough to ship inside kgpipe (gzip-compressed); the others are read from a
folder or URL given as ``data.root`` holding ``{name}/{train,valid,test}.txt``. Every split read
by name is verified against the SHA-256 of the published file (of the decompressed content).
"""

from __future__ import annotations

from importlib import resources

from kgpipe.errors import ConfigError

__all__ = [
    "BENCHMARKS",
    "BUNDLED",
    "SPLITS",
    "canonical_benchmark_name",
    "resolve_benchmark",
]

#: The splits of a benchmark, in the order they are read.
SPLITS: tuple[str, str, str] = ("train", "valid", "test")

#: Benchmark name -> split -> SHA-256 (hex) of the published, uncompressed file.
BENCHMARKS: dict[str, dict[str, str]] = {
    "fb15k-237": {
        "train": "6e4c2782169af21e9743f3b1d200886f5d595bf6bc504ec1351720949c5cdfae",
        "valid": "cf6309010852f6a8d47a45df830a426415d1ee6f7a3970a8376ff1fb81db4a5c",
        "test": "5711cf41623ceb4eacc50eb6108a3ca6565c7492e3caaf82a3e355cc660d1574",
    },
    "wn18rr": {
        "train": "038612e783c215ee5f3ca9fbfca27b8d0739be1028fe4ee7c174aecf0b83d5df",
        "valid": "453ce7202afa58094a04d2b1560ee2b02660f1c260b32ce6651c8ccedd1028ab",
        "test": "0383bceaaa1096cf3c03ec021ed0048068e2355dbfc0239b292cefdac821cec5",
    },
    "kinship": {
        "train": "738612111a6acf0e39662bde24c7e72a4d1edf20931beea077da367dda689731",
        "valid": "c56f8630a583178b1e569f11a64aa535ae1ce0b0912d8b1e24716be2b37f04da",
        "test": "05e5733265761d55be9c05bfaff5a8d0808df46f9c1e9d66cc3f2fe114e43d88",
    },
    "umls": {
        "train": "873ef4925516b83e7f6f8cc02b4be51d848828710a7f65a956f0ac4a9e452f35",
        "valid": "025c98f8a4891e2a6582ec5b40ee0d904031edad9c52554522f4b7904820c98e",
        "test": "a7eb529a3d2810fcc96341ccc97c625a5e202f8389673aa6bd317eeebbb79014",
    },
    "nations": {
        "train": "0830fa9da8e5bba2ccdaa45b7bdc9130451ba66b09ff2708f35fccaf82473e57",
        "valid": "2b337a62e51a2f45c283eac98a70d21b7e0e102136be1539b2a52c652a7b0530",
        "test": "3971085165b47b6aeaec68058c6d8d98b3005e929db81268410b95ae4db770ab",
    },
}

#: Benchmarks shipped inside the kgpipe package (readable without ``data.root``).
BUNDLED: frozenset[str] = frozenset({"umls"})


def canonical_benchmark_name(name: str) -> str:
    """The key of ``name`` in :data:`BENCHMARKS` (case-insensitive); ConfigError if unknown."""
    key = name.strip().lower()
    if key not in BENCHMARKS:
        known = ", ".join(sorted(BENCHMARKS))
        raise ConfigError(f"unknown benchmark data set {name!r}; known: {known}")
    return key


def resolve_benchmark(name: str, root: str | None) -> dict[str, str]:
    """The URL of each split (``train``, ``valid``, ``test``) of a named benchmark.

    With ``root`` set, the files are ``{root}/{name}/{split}.txt`` (a local folder or any fsspec
    URL). Without it, only the bundled benchmarks (:data:`BUNDLED`) can be found: their
    compressed copies inside the installed package. Raises :class:`~kgpipe.errors.ConfigError`
    (a :class:`~kgpipe.errors.KgpipeError`) for an unknown name, or for a benchmark that is not
    bundled when ``root`` is None.
    """
    key = canonical_benchmark_name(name)
    if root is None:
        if key not in BUNDLED:
            bundled = ", ".join(sorted(BUNDLED))
            raise ConfigError(
                f"benchmark {key!r} is not bundled with kgpipe (bundled: {bundled}); set "
                f"data.root to a folder or URL holding {key}/train.txt, {key}/valid.txt and "
                f"{key}/test.txt"
            )
        folder = resources.files("kgpipe") / "datasets" / key
        return {split: str(folder / f"{split}.txt.gz") for split in SPLITS}
    base = root.rstrip("/") if root.rstrip("/") else root
    if base.endswith("/"):  # root is "/" (or "s3://"-like): avoid a doubled slash
        return {split: f"{base}{key}/{split}.txt" for split in SPLITS}
    return {split: f"{base}/{key}/{split}.txt" for split in SPLITS}
