"""What the README and docs/deploy.md tell an operator to set and run holds for the files and settings it names."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings

REPO = Path(__file__).resolve().parents[3]
DEPLOY_MD = REPO / "docs" / "deploy.md"


def test_deploy_md_says_how_to_listen_on_an_ipv6_cluster(known_env):
    text = DEPLOY_MD.read_text(encoding="utf-8")
    names = ("RTT_EXTENDER_HOST", "RTT_METRICS_HOST")
    for name in names:
        assert f'`{name}: "::"`' in text, f"docs/deploy.md does not say to set {name} to :: on an IPv6 cluster"
        assert name in known_env
    settings = Settings.from_env(dict.fromkeys(names, "::"))
    assert (settings.extender_host, settings.metrics_host) == ("::", "::")
