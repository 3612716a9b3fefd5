"""``tether dev upstream build|path``: clear errors without sources or a build, and the cache's validity rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tether_devenv import upstream

TETHER = str(Path(sys.executable).parent / "tether")


def run(*args: str, cache: Path, sources: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, TETHER_CACHE_DIR=str(cache), TETHER_UPSTREAM_SOURCES=str(sources), COLUMNS="200")
    return subprocess.run(
        [TETHER, "dev", "upstream", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def test_build_without_sources_names_the_folder(tmp_path: Path) -> None:
    result = run("build", cache=tmp_path / "cache", sources=tmp_path / "nowhere")
    assert result.returncode == 1
    assert "gitlab-agent-8daa08cc.tar.gz not found" in result.stderr
    assert "TETHER_UPSTREAM_SOURCES" in result.stderr and "Traceback" not in result.stderr


def test_path_before_a_build_says_how_to_build(tmp_path: Path) -> None:
    result = run("path", cache=tmp_path / "cache", sources=tmp_path)
    assert result.returncode == 1
    assert "tether dev upstream build" in result.stderr and "Traceback" not in result.stderr


def test_cache_problems(tmp_path: Path) -> None:
    assert "manifest.json missing" in str(upstream.cache_problem(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps({"gitlab_agent": "v0", "glab": upstream.GLAB_VERSION}))
    assert "stale" in str(upstream.cache_problem(tmp_path))
    (tmp_path / "manifest.json").write_text(json.dumps(upstream.expected_manifest()))
    assert "kas is missing" in str(upstream.cache_problem(tmp_path))
    for name in upstream.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert upstream.cache_problem(tmp_path) is None


def test_a_component_is_reused_only_when_its_recipe_and_sources_are_unchanged(tmp_path: Path) -> None:
    """A cache from before glab was stamped builds glab again but keeps kas and agentk (18 minutes on 2 cores)."""
    agent, glab = upstream._STEPS
    digests = {upstream.AGENT_TARBALL: "a", upstream.AGENT_PATCH: "p", upstream.GLAB_TARBALL: "g"}
    for name in upstream.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    unstamped = {"gitlab_agent": upstream.AGENT_VERSION, "glab": upstream.GLAB_VERSION}
    manifest = dict(unstamped, sources=digests, build_seconds={"gitlab-agent": 1098.0, "glab": 372.2})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert "glab_stamp is None" in str(upstream.cache_problem(tmp_path))
    assert upstream.reusable(tmp_path, agent, digests) == 1098.0
    assert upstream.reusable(tmp_path, glab, digests) is None
    assert upstream.reusable(tmp_path, agent, {**digests, upstream.AGENT_PATCH: "changed"}) is None
    (tmp_path / "kas").unlink()
    assert upstream.reusable(tmp_path, agent, digests) is None
    (tmp_path / "manifest.json").write_text(json.dumps(dict(manifest, **upstream.expected_manifest())))
    assert upstream.reusable(tmp_path, glab, digests) == 372.2


def test_verification_turns_off_glabs_update_check(tmp_path: Path) -> None:
    """glab reports its failed look for a newer release (no internet) after the version, unless told not to look."""
    for name in ("kas", "agentk"):
        (tmp_path / name).write_text("#!/bin/sh\necho v16.5.0\n")
    (tmp_path / "glab").write_text(
        "#!/bin/sh\n"
        f"echo '{upstream.GLAB_STAMP}'\n"
        'if [ "$GLAB_CHECK_UPDATE" != false ]; then echo "ERROR: failed checking for glab updates" >&2; fi\n'
    )
    for name in upstream.BINARIES:
        (tmp_path / name).chmod(0o755)
    upstream._verify(tmp_path)
