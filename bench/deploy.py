"""Image sizes for bench/results/deploy.json: `make images`, then the size of each image's root filesystem.

Usage: python bench/deploy.py [--force] [NAME...]
  --force rebuilds every image and records the warm build times; NAME...: only these images.

Uncompressed size = the layer tar (the unpacked root filesystem), compressed = the gzip layer blob, both MiB.
Other deploy.json metrics (issue 22's end-to-end figures) are kept: only the image entries are replaced.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "deploy.json"


def main() -> None:
    args = [sys.executable, "-m", "tether.devenv.images", "--json", *sys.argv[1:]]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    figures: dict[str, tuple[float, str]] = {}
    for line in out.splitlines():
        image = json.loads(line)
        name = image["name"].replace("-", "_")  # front-proxy -> front_proxy_image_mib
        figures[f"{name}_image_mib"] = (round(image["uncompressed_bytes"] / 2**20, 1), "MiB")
        figures[f"{name}_image_compressed_mib"] = (round(image["compressed_bytes"] / 2**20, 1), "MiB")
    existing = json.loads(RESULTS.read_text()) if RESULTS.is_file() else []
    entries = [{"metric": m, "value": v, "unit": u} for m, (v, u) in figures.items()]
    # Replaced in place, new metrics appended: the file keeps its order (other sessions add their lines too).
    by_metric = {entry["metric"]: entry for entry in entries}
    updated = [by_metric.pop(entry["metric"], entry) for entry in existing]
    RESULTS.write_text(json.dumps(updated + list(by_metric.values()), indent=2) + "\n")
    for entry in entries:
        print(f"{entry['metric']}: {entry['value']} {entry['unit']}")


if __name__ == "__main__":
    main()
