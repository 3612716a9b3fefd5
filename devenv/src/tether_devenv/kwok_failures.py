"""kwok stages that make chosen pods fail, so tests and demos can show a workspace that cannot start.

kwok marks every bound pod Running (stage ``pod-ready``). A pod whose first container's image is one of
:data:`FAILING_IMAGES` instead gets the matching failure: its container waits with ``ImagePullBackOff`` or
``CrashLoopBackOff`` and the pod never becomes Ready, as a kubelet would report it. ``pod-ready`` is given
one more selector so that it leaves those pods alone (kwok picks at random among matching stages).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: Image -> (waiting reason, message) kwok reports for a pod running it.
FAILING_IMAGES: dict[str, tuple[str, str]] = {
    "registry.tether.invalid/image-pull-fails:1": (
        "ImagePullBackOff",
        'Back-off pulling image "registry.tether.invalid/image-pull-fails:1": not found',
    ),
    "registry.tether.invalid/crash-loops:1": (
        "CrashLoopBackOff",
        "back-off 40s restarting failed container",
    ),
}
_FIRST_IMAGE = ".spec.containers.[0].image"


def _failure_stage(image: str, reason: str, message: str, index: int) -> dict[str, Any]:
    status = f"""
conditions:
- type: Ready
  status: "False"
  reason: ContainersNotReady
- type: PodScheduled
  status: "True"
containerStatuses:
{{{{ range .spec.containers }}}}
- image: {{{{ .image | Quote }}}}
  name: {{{{ .name | Quote }}}}
  ready: false
  restartCount: {1 if reason == "CrashLoopBackOff" else 0}
  state:
    waiting:
      reason: {reason}
      message: {yaml.safe_dump(message, default_style='"').strip()}
{{{{ end }}}}
phase: {"Running" if reason == "CrashLoopBackOff" else "Pending"}
"""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Stage",
        "metadata": {"name": f"tether-pod-fails-{index}"},
        "spec": {
            "resourceRef": {"apiGroup": "v1", "kind": "Pod"},
            "selector": {
                "matchExpressions": [
                    {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"},
                    {"key": _FIRST_IMAGE, "operator": "In", "values": [image]},
                    {
                        "key": ".status.containerStatuses.[0].state.waiting.reason",
                        "operator": "NotIn",
                        "values": [reason],
                    },
                ]
            },
            "next": {"statusTemplate": status},
        },
    }


def stage_files(stages: tuple[Path, ...], directory: Path) -> list[Path]:
    """Kwok's stage files with ``pod-ready`` narrowed and the failure stages added, written to ``directory``.

    Args:
        stages: the stage files from the cached assets.
        directory: where the edited and the new files go (the cluster's directory).
    """
    directory.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    for path in stages:
        if path.name != "pod-ready.yaml":
            files.append(path)
            continue
        stage = yaml.safe_load(path.read_text())
        stage["spec"]["selector"]["matchExpressions"].append(
            {"key": _FIRST_IMAGE, "operator": "NotIn", "values": sorted(FAILING_IMAGES)}
        )
        edited = directory / "pod-ready.yaml"
        edited.write_text(yaml.safe_dump(stage, sort_keys=False))
        files.append(edited)
    failures = directory / "tether-pod-failures.yaml"
    failures.write_text(
        yaml.safe_dump_all(
            [_failure_stage(image, *failure, i) for i, (image, failure) in enumerate(sorted(FAILING_IMAGES.items()))],
            sort_keys=False,
        )
    )
    files.append(failures)
    return files
