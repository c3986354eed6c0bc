"""Quality of the shipped demo config on the bundled graph (the README's main job)."""

from __future__ import annotations

from pathlib import Path

from kgpipe.config import load_config
from kgpipe.pipeline import train

REPO = Path(__file__).resolve().parents[1]


def test_demo_config_reaches_mrr_080_on_bundled_umls(tmp_path: Path) -> None:
    config = load_config(str(REPO / "configs" / "umls-complex.yaml"), [f"run.root={tmp_path}"])
    result = train(config)
    assert result.results is not None
    assert result.results["mrr"] >= 0.80, result.results
    assert result.results["triples"] == 661
    # validation ran every 25 epochs and was recorded
    assert [s.epoch for s in result.history if "valid_mrr" in s.extra] == [25, 50, 75, 100]
