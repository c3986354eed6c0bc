"""The Prefect test infrastructure itself: a real server, artifacts over its API, and its UI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from prefect_support import PrefectServer, find_chromium, render_page

pytestmark = pytest.mark.slow


def _smoke_flow_run() -> tuple[UUID, dict[str, Any]]:
    from prefect import flow
    from prefect.artifacts import (
        create_markdown_artifact,
        create_progress_artifact,
        create_table_artifact,
        update_progress_artifact,
    )
    from prefect.runtime import flow_run

    @flow(name="kgpipe-smoke", flow_run_name="kgpipe-smoke-run", persist_result=False)
    def smoke() -> tuple[UUID, dict[str, Any]]:
        ids: dict[str, Any] = {
            "table": create_table_artifact(
                [{"metric": "mrr", "value": 0.4242}],
                key="smoke-table",
                description="Smoke table description",
            ),
            "markdown": create_markdown_artifact(
                "# Smoke heading\n\nsmoke markdown body",
                key="smoke-markdown",
                description="Smoke markdown description",
            ),
            "progress": create_progress_artifact(
                0.0, key="smoke-progress", description="Smoke progress description"
            ),
        }
        update_progress_artifact(ids["progress"], 100.0)
        return UUID(flow_run.id), ids

    return smoke()


def test_flow_artifacts_reach_server_and_ui(
    prefect_env: PrefectServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    run_id, ids = _smoke_flow_run()

    with get_client(sync_client=True) as client:
        # the session's server, not an ephemeral one
        assert str(client.api_url).rstrip("/") == prefect_env.api_url
        run = client.read_flow_run(run_id)
        assert run.name == "kgpipe-smoke-run"
        assert run.state is not None and run.state.is_completed()
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )
    by_key = {a.key: a for a in artifacts}
    assert set(by_key) == {"smoke-table", "smoke-markdown", "smoke-progress"}
    assert by_key["smoke-table"].type == "table"
    assert by_key["smoke-progress"].type == "progress"
    assert float(by_key["smoke-progress"].data) == 100.0  # type: ignore[arg-type]
    assert "smoke markdown body" in str(by_key["smoke-markdown"].data)

    if find_chromium() is None:
        if os.environ.get("KGPIPE_REQUIRE_CHROMIUM"):
            pytest.fail("chromium is required (KGPIPE_REQUIRE_CHROMIUM) but not installed")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    ui = prefect_env.ui_url
    out = tmp_path / "ui"

    # The default (V1) UI's flow-run page: run name, flow name and state.
    html, png = render_page(f"{ui}/runs/flow-run/{run_id}", out, name="flow-run")
    assert "<title>Flow Run: kgpipe-smoke-run" in html
    for text in ("kgpipe-smoke", "Completed"):
        assert text in html
    shots = [png]

    # The V2 UI honours ?tab=Artifacts on load (V1 resets to Logs): every key and description.
    html, png = render_page(f"{ui}/v2/runs/flow-run/{run_id}?tab=Artifacts", out, name="v2-tab")
    assert "<title>Flow Run: kgpipe-smoke-run" in html
    for key in ("smoke-table", "smoke-markdown", "smoke-progress"):
        assert key in html
    for kind in ("table", "markdown", "progress"):
        assert f"Smoke {kind} description" in html
    shots.append(png)

    # One artifact page each: the rendered content.
    expected = {
        "table": ["mrr", "0.4242"],
        "markdown": [">Smoke heading</h1>", "smoke markdown body"],
        "progress": ["Progress: 100%"],
    }
    for kind, texts in expected.items():
        html, png = render_page(
            f"{ui}/artifacts/artifact/{ids[kind]}", out, name=f"artifact-{kind}"
        )
        assert f"<title>Artifact: smoke-{kind}" in html
        assert "kgpipe-smoke-run" in html  # the flow run it belongs to
        for text in texts:
            assert text in html, (kind, text)
        shots.append(png)

    for shot in shots:
        assert shot.stat().st_size > 20_000, f"{shot} looks blank"
    with capsys.disabled():  # shown even under -q; pytest keeps the last 3 sessions' tmp dirs
        print(f"\nPrefect UI screenshots: {out}")


def test_the_suite_keeps_out_of_the_users_prefect_home() -> None:
    """Flows run in tests (their temporary servers' SQLite included) write under a PREFECT_HOME
    of the test session, never the user's ~/.prefect; and no configured server is used."""
    from prefect.settings import get_current_settings

    home = Path(get_current_settings().home).resolve()
    assert home == Path(os.environ["PREFECT_HOME"]).resolve()
    assert not home.is_relative_to(Path.home() / ".prefect")
    assert "kgpipe-tests-prefect-home-" in home.name
    assert "PREFECT_API_URL" not in os.environ or "127.0.0.1" in os.environ["PREFECT_API_URL"]
